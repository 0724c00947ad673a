"""Write a tiny random-weight Llama model that vLLM can serve (run with the vLLM environment's
python: ``python _tiny_model.py OUTPUT_DIR SEED``).

Deterministic from the seed: hidden size 128, 2 attention heads (head size 64: vLLM's CPU
attention accepts 32, 64, 80, ...), 2 layers, a byte-level tokenizer (256 byte tokens plus
``<s>``, ``</s>``, ``<pad>``; no merges) built locally with ``tokenizers``, and a ChatML chat
template. Nothing is downloaded. Prints the written file names, one per line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def tokenizer() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    for special in SPECIALS:
        vocab[special] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",  # noqa: S106 (special tokens, not passwords)
        eos_token="<|im_end|>",  # noqa: S106
        pad_token="<pad>",  # noqa: S106
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def main(out: Path, seed: int) -> None:
    torch.manual_seed(seed)
    tok = tokenizer()
    config = LlamaConfig(
        vocab_size=320,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "werk-demo.json").write_text(json.dumps({"seed": seed, "kind": "vllm"}) + "\n")
    for path in sorted(p for p in out.iterdir() if p.is_file()):
        print(path.name)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
