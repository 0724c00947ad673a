"""Run by the media environment's python (never imported by Werk): write a tiny Stable
Diffusion pipeline, deterministic for a seed, with a tokenizer built locally (no hub access).

``python _tiny_image.py TARGET_DIR SEED`` writes a Diffusers ``save_pretrained`` directory
(UNet and VAE with ``block_out_channels (32, 64)``, a 2-layer CLIP text encoder of width 32, a
character-level CLIP tokenizer, a DDIM scheduler; about 6 MB) and prints the relative paths of
the files it wrote, one per line.
"""

from __future__ import annotations

import json
import string
import sys
from pathlib import Path


def _vocabulary() -> dict[str, int]:
    """A CLIP BPE vocabulary without merges: every character is a token (``</w>`` ends a word)."""
    vocab: dict[str, int] = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in string.ascii_lowercase + string.digits + string.punctuation:
        for token in (char, char + "</w>"):
            vocab.setdefault(token, len(vocab))
    return vocab


def main(target: Path, seed: int) -> None:
    import torch
    from diffusers import (
        AutoencoderKL,
        DDIMScheduler,
        StableDiffusionPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        block_out_channels=(32, 64),
        layers_per_block=1,
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
    )
    vae = AutoencoderKL(
        block_out_channels=(32, 64),
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
        up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
        latent_channels=4,
    )
    tokenizer = CLIPTokenizer(vocab=_vocabulary(), merges=[], model_max_length=77)
    if len(tokenizer) < 100:  # the tokenizer API took the vocabulary in another way
        raise SystemExit(f"the tokenizer has {len(tokenizer)} tokens; expected the vocabulary")
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            bos_token_id=0,
            eos_token_id=1,
            pad_token_id=1,
            hidden_size=32,
            intermediate_size=37,
            layer_norm_eps=1e-05,
            num_attention_heads=4,
            num_hidden_layers=2,
            vocab_size=len(tokenizer),
            max_position_embeddings=77,
        )
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
    )
    pipeline = StableDiffusionPipeline(
        unet=unet,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(target), safe_serialization=True)
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": "image", "seed": seed}, sort_keys=True) + "\n", encoding="utf-8"
    )
    for path in sorted(target.rglob("*")):
        if path.is_file():
            print(path.relative_to(target))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
