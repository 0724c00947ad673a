"""Run by the mlx-vlm environment's python (never imported by Werk): write a tiny random LLaVA
that MLX-VLM loads — the host's tiny Llama as its language model (its tokenizer with an
``<image>`` token), a 2-layer CLIP vision tower of width 32 for 32×32 images in 8×8 patches
(16 image tokens), a projector, and a chat template that places ``<image>`` where an image part
was; deterministic for a seed.

``python _tiny_llava.py TARGET_DIR SEED HOST_DEMO_DIR`` (``HOST_DEMO_DIR``: the folder of
:func:`werk.tiny_llama_script`) writes a ``save_pretrained`` directory with its processor and
prints the files it wrote. Transformers saves the vision tower's keys without the
``vision_model.`` level MLX-VLM's LLaVA expects; they are renamed in the saved weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

IMAGE = "<image>"
TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>\n"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def main(target: Path, seed: int) -> None:
    import torch
    from safetensors.torch import load_file, save_file
    from tiny_llama import text_config, tokenizer, written
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    target.mkdir(parents=True, exist_ok=True)
    built = tokenizer(extra=(IMAGE,))
    built.chat_template = TEMPLATE
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
        ),
        tokenizer=built,
        patch_size=8,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=TEMPLATE,
        image_token=IMAGE,
    )
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=32,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text_config(built),
        image_token_index=built.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).save_pretrained(str(target), safe_serialization=True)
    processor.save_pretrained(str(target))
    weights_file = target / "model.safetensors"
    weights = load_file(str(weights_file))
    prefix = "vision_tower."
    renamed = {
        (
            prefix + "vision_model." + key[len(prefix) :]
            if key.startswith(prefix) and not key.startswith(prefix + "vision_model.")
            else key
        ): value
        for key, value in weights.items()
    }
    save_file(renamed, str(weights_file), metadata={"format": "pt"})
    (target / "werk-demo.json").write_text(
        json.dumps({"kind": "mlx-vlm", "seed": seed}, sort_keys=True) + "\n", encoding="utf-8"
    )
    written(target)


if __name__ == "__main__":
    sys.path.insert(0, sys.argv[3])
    main(Path(sys.argv[1]), int(sys.argv[2]))
