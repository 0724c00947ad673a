"""Write a tiny random-weight Llama in the Hugging Face layout ``mlx_lm.load`` reads (test code:
the oMLX stand-in serves it). Deterministic from the seed.

Hidden size 64, 2 layers, 2 heads; a byte-level tokenizer (256 byte tokens, no merges) with
``<s>``, ``</s>``, ``<|im_start|>``, ``<|im_end|>`` built locally with ``tokenizers``, and a
ChatML chat template. Nothing is downloaded. ``python tiny_mlx_model.py TARGET SEED``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def _tokenizer(target: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(target))
    return {token: int(core.token_to_id(token)) for token in SPECIALS} | {
        "vocab": core.get_vocab_size()
    }


def write(target: Path, seed: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    target.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(target)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": ids["vocab"],
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["<|im_end|>"],
        "torch_dtype": "float32",
    }
    mx.random.seed(seed)
    args = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    args.pop("bos_token_id")
    args.pop("eos_token_id")
    model = llama.Model(llama.ModelArgs(**args))
    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]), int(sys.argv[2]))
