"""Run by the Qwen3-TTS environment's python (never imported by Werk): write a tiny random
Qwen3-TTS CustomVoice model (qwen-tts 0.1.1 layout), deterministic for a seed, no hub.

``python _tiny_qwen_tts.py TARGET_DIR SEED`` writes what ``Qwen3TTSModel.from_pretrained``
reads and prints the relative paths of the files it wrote, one per line:

* ``config.json`` + ``model.safetensors``: ``Qwen3TTSForConditionalGeneration`` (talker with
  hidden size 32, one layer, four code groups; one speaker ``tiny``; language ``english``);
* a byte-level BPE text tokenizer built here (``<|im_start|>``, ``assistant``, ``user`` and
  the newline are single tokens, as the model's prompt slicing needs) with the processor files;
* ``speech_tokenizer/``: the 12 Hz codec (``Qwen3TTSTokenizerV2Model``: a tiny Mimi encoder,
  a tiny decoder with the real 1920x upsampling, so 24 kHz audio at 12.5 codes/s) and its
  feature extractor;
* ``generation_config.json``: greedy decoding, at most 24 codes (about 1.9 s of audio).

Random weights: the audio is noise-like, but every stage runs for real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CODEBOOK = 64
CODE_GROUPS = 4
CODEC_VOCAB = 1024 + CODEBOOK  # qwen-tts suppresses the top 1024 ids except end-of-speech
CODEC_SPECIAL = {
    "codec_pad_id": 1000,
    "codec_bos_id": 1001,
    "codec_eos_token_id": 1002,
    "codec_think_id": 1003,
    "codec_nothink_id": 1004,
    "codec_think_bos_id": 1005,
    "codec_think_eos_id": 1006,
}
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
)
SPEAKER_ENCODER_FIELDS = (
    "mel_dim",
    "enc_dim",
    "enc_channels",
    "enc_kernel_sizes",
    "enc_dilations",
    "enc_attention_channels",
    "enc_res2net_scale",
    "enc_se_channels",
    "sample_rate",
)


def _text_tokenizer() -> tuple[object, dict[str, int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast

    vocab = {char: index for index, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    merges = []
    for word in ("assistant", "user"):
        joined = word[0]
        for char in word[1:]:
            merges.append((joined, char))
            joined += char
            vocab.setdefault(joined, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    ids = {token: int(tokenizer.token_to_id(token)) for token in SPECIAL_TOKENS}
    fast = Qwen2TokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=None,
        bos_token=None,
        eos_token="<|endoftext|>",  # noqa: S106 - a token, not a password
        pad_token="<|endoftext|>",  # noqa: S106
    )
    return fast, ids


def main(target: Path, seed: int) -> None:
    listing, sys.stdout = sys.stdout, sys.stderr  # qwen-tts prints banners on import
    _write(target, seed)
    sys.stdout = listing
    for path in sorted(target.rglob("*")):
        if path.is_file():
            print(path.relative_to(target))


def _write(target: Path, seed: int) -> None:
    import _qwen_compat

    _qwen_compat.install()
    import torch
    from qwen_tts.core.models import (
        Qwen3TTSConfig,
        Qwen3TTSForConditionalGeneration,
        Qwen3TTSProcessor,
    )
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )
    from transformers import EncodecFeatureExtractor

    torch.manual_seed(seed)
    target.mkdir(parents=True, exist_ok=True)
    text_tokenizer, ids = _text_tokenizer()
    Qwen3TTSProcessor(tokenizer=text_tokenizer).save_pretrained(str(target))
    attention = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
    config = Qwen3TTSConfig(
        talker_config={
            "vocab_size": CODEC_VOCAB,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "max_position_embeddings": 512,
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [4, 2, 2],
                "interleaved": True,
            },
            "num_code_groups": CODE_GROUPS,
            "text_hidden_size": 32,
            "text_vocab_size": len(text_tokenizer),  # type: ignore[arg-type]
            "spk_id": {"tiny": 1010},
            "spk_is_dialect": {"tiny": False},
            "codec_language_id": {"english": 1020},
            "code_predictor_config": {
                "vocab_size": CODEBOOK,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_code_groups": CODE_GROUPS,
                "max_position_embeddings": 64,
                **attention,
            },
            **attention,
            **CODEC_SPECIAL,
        },
        speaker_encoder_config={
            "enc_dim": 32,
            "enc_channels": [16, 16, 16, 16, 48],
            "enc_attention_channels": 8,
            "enc_res2net_scale": 2,
            "enc_se_channels": 8,
        },
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="tiny",
        tts_model_type="custom_voice",
        im_start_token_id=ids["<|im_start|>"],
        im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"],
    )
    Qwen3TTSForConditionalGeneration(config).save_pretrained(str(target))
    # The speaker encoder's config takes only its own fields (no **kwargs) when read back.
    written = json.loads((target / "config.json").read_text(encoding="utf-8"))
    encoder = written["speaker_encoder_config"]
    written["speaker_encoder_config"] = {key: encoder[key] for key in SPEAKER_ENCODER_FIELDS}
    (target / "config.json").write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    (target / "generation_config.json").write_text(
        json.dumps(
            {
                "do_sample": False,
                "subtalker_dosample": False,
                "max_new_tokens": 24,
                "repetition_penalty": 1.0,
            },
            sort_keys=True,
        )
        + "\n"
    )
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    codec = Qwen3TTSTokenizerV2Config(
        encoder_config={
            **small,
            "num_filters": 4,
            "codebook_size": CODEBOOK,
            "codebook_dim": 32,
            "num_quantizers": CODE_GROUPS,
            "num_semantic_quantizers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 32,
            "upsample_groups": 32,
        },
        decoder_config={
            **small,
            "codebook_size": CODEBOOK,
            "codebook_dim": 32,
            "latent_dim": 32,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_quantizers": CODE_GROUPS,
            "decoder_dim": 64,
            "sliding_window": 32,
        },
        encoder_valid_num_quantizers=CODE_GROUPS,
    )
    codec_model = Qwen3TTSTokenizerV2Model(codec)
    with torch.no_grad():  # codebooks start as zero sums, which would decode every code to silence
        for name, tensor in codec_model.state_dict().items():
            if name.endswith("embedding_sum"):
                tensor.copy_(torch.randn_like(tensor))
    codec_dir = target / "speech_tokenizer"
    codec_model.save_pretrained(str(codec_dir))
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0).save_pretrained(
        str(codec_dir)
    )
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": "qwen-tts", "seed": seed}, sort_keys=True) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
