"""Run by the media environment's python (never imported by Werk): write a tiny random text
classifier (``BertForSequenceClassification``, labels ``negative``/``positive``) with a
character-level WordPiece vocabulary built locally (no hub), deterministic for a seed.

``python _tiny_text.py TARGET_DIR SEED`` writes a ``save_pretrained`` directory and prints the
relative paths of the files it wrote, one per line.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LABELS = {0: "negative", 1: "positive"}


def main(target: Path, seed: int) -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    torch.manual_seed(seed)
    target.mkdir(parents=True, exist_ok=True)
    vocab = target / "vocab.txt"
    characters = string.ascii_lowercase + string.digits + string.punctuation
    vocab.write_text("\n".join([*SPECIAL, *characters]) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab_file=str(vocab), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        id2label=LABELS,
        label2id={label: index for index, label in LABELS.items()},
    )
    BertForSequenceClassification(config).save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": "classify", "seed": seed}, sort_keys=True) + "\n", encoding="utf-8"
    )
    for path in sorted(target.rglob("*")):
        if path.is_file():
            print(path.relative_to(target))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
