"""Run by a plugin environment's python, never imported by Werk (:func:`werk.tiny_llama_script`):
write a tiny random Llama (``LlamaForCausalLM``: hidden 64, 2 layers, 4 heads, 2 KV heads) with
a byte-level BPE tokenizer trained here on a built-in corpus (no hub), a chat template in
``chat_template.jinja``, and ``<|end|>`` as its end-of-turn token; deterministic for a seed.

``python tiny_llama.py TARGET_DIR SEED`` writes a ``save_pretrained`` directory and prints the
relative paths of the files it wrote, one per line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SPECIAL = ["<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = [
    "the",
    "a",
    "model",
    "werk",
    "state",
    "prefix",
    "cache",
    "token",
    "answer",
    "question",
    "hello",
    "world",
    "local",
    "server",
    "memory",
    "disk",
    "restore",
    "save",
    "chat",
    "turn",
    "user",
    "assistant",
    "system",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "red",
    "green",
    "blue",
    "light",
    "dark",
]
VOCABULARY = 512
CONTEXT = 2048


def _corpus() -> list[str]:
    """Sentences over a fixed word list: the same corpus (and so the same merges) every run."""
    lines = []
    for i in range(400):
        words = [WORDS[(i * 7 + j * 13) % len(WORDS)] for j in range(3 + i % 9)]
        lines.append(" ".join(words).capitalize() + ("?" if i % 5 == 0 else "."))
    return lines


def tokenizer(extra: tuple[str, ...] = ()) -> Any:
    """The byte-level BPE tokenizer trained on the built-in corpus, with the chat template
    (``extra``: more special tokens, e.g. an image marker for a vision model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY,
        special_tokens=[*SPECIAL, *extra],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer)
    built = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token="<|begin|>",  # noqa: S106 - special tokens, not passwords
        eos_token="<|end|>",  # noqa: S106
        pad_token="<|end|>",  # noqa: S106
        model_max_length=CONTEXT,
    )
    built.chat_template = TEMPLATE
    return built


def text_config(built: Any) -> Any:
    """The tiny Llama's configuration for ``built`` (hidden 64, 2 layers, 4 heads, 2 KV heads)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(built),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        bos_token_id=built.bos_token_id,
        eos_token_id=built.eos_token_id,
        pad_token_id=built.pad_token_id,
        tie_word_embeddings=False,
    )


def written(target: Path) -> None:
    """Print the files under ``target``, relative, one per line."""
    for path in sorted(target.rglob("*")):
        if path.is_file():
            print(path.relative_to(target))


def main(target: Path, seed: int) -> None:
    import torch  # type: ignore[import-not-found]  # the plugin environment's, not Werk's
    from transformers import LlamaForCausalLM

    target.mkdir(parents=True, exist_ok=True)
    built = tokenizer()
    torch.manual_seed(seed)
    LlamaForCausalLM(text_config(built)).save_pretrained(str(target), safe_serialization=True)
    built.save_pretrained(str(target))
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": "transformers", "seed": seed}, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    written(target)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
