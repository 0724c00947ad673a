"""Run by the media environment's python (never imported by Werk): write a tiny Transformers
audio model, deterministic for a seed, with a character vocabulary built locally (no hub).

``python _tiny_audio.py KIND TARGET_DIR SEED`` with KIND ``tts`` (a VITS text-to-speech model,
16 kHz) or ``asr`` (a wav2vec2 CTC speech recognizer, 16 kHz) writes a ``save_pretrained``
directory and prints the relative paths of the files it wrote, one per line.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path

CHARACTERS = string.ascii_lowercase + " '"


def _write_vocab(path: Path, vocab: dict[str, int]) -> None:
    path.write_text(json.dumps(vocab, sort_keys=True), encoding="utf-8")


def _tts(target: Path) -> None:
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    vocab = {char: index for index, char in enumerate(["<pad>", *CHARACTERS])}
    vocab_file = target / "vocab.json"
    _write_vocab(vocab_file, vocab)
    tokenizer = VitsTokenizer(
        vocab_file=str(vocab_file),
        pad_token="<pad>",  # noqa: S106 - a token, not a password
        add_blank=True,
        phonemize=False,
    )
    config = VitsConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=16,
        flow_size=16,
        spectrogram_bins=16,
        upsample_initial_channel=16,
        upsample_rates=[8, 8, 4],
        upsample_kernel_sizes=[16, 16, 8],
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 3]],
        duration_predictor_filter_channels=16,
        duration_predictor_num_flows=2,
        prior_encoder_num_flows=2,
        prior_encoder_num_wavenet_layers=2,
        posterior_encoder_num_wavenet_layers=2,
        depth_separable_num_layers=2,
        sampling_rate=16000,
    )
    VitsModel(config).save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))


def _asr(target: Path) -> None:
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    specials = ["<pad>", "<s>", "</s>", "<unk>", "|"]
    vocab = {token: index for index, token in enumerate([*specials, *CHARACTERS.strip()])}
    vocab_file = target / "vocab.json"
    _write_vocab(vocab_file, vocab)
    tokenizer = Wav2Vec2CTCTokenizer(str(vocab_file), word_delimiter_token="|")  # noqa: S106
    extractor = Wav2Vec2FeatureExtractor(
        feature_size=1, sampling_rate=16000, padding_value=0.0, do_normalize=True
    )
    config = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 4, 4),
        conv_kernel=(10, 4, 4),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
        do_stable_layer_norm=True,
        feat_extract_norm="layer",
    )
    Wav2Vec2ForCTC(config).save_pretrained(str(target), safe_serialization=True)
    Wav2Vec2Processor(feature_extractor=extractor, tokenizer=tokenizer).save_pretrained(str(target))


def main(kind: str, target: Path, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    target.mkdir(parents=True, exist_ok=True)
    {"tts": _tts, "asr": _asr}[kind](target)
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": kind, "seed": seed}, sort_keys=True) + "\n", encoding="utf-8"
    )
    for path in sorted(target.rglob("*")):
        if path.is_file():
            print(path.relative_to(target))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
