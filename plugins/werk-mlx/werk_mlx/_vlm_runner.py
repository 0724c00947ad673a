"""Werk's MLX-VLM runner: one process per request on Werk's runner contract (:mod:`werk.runner`,
``werk_companion_frames.run_once``). Run by the mlx-vlm environment's python, never imported by
Werk.

stdin: the model folder in ``model`` and the generation arguments; a message's content may be a
list of ``{"type": "text", "text"}`` and ``{"type": "image", "url": DATA_URL}`` parts (checked by
the host). Each image is written into this run's private directory (the working directory),
the model's chat template places an image marker where it was, and ``mlx_vlm``'s
``stream_generate`` answers. Nothing stays loaded.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import GeneratedText, run_once


def _images(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages with image parts as ``{"type": "image"}``, and the images' files, in order."""
    files: list[str] = []
    converted = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            parts = []
            for part in content:
                if part["type"] == "image":
                    name = f"image-{len(files)}"
                    Path(name).write_bytes(base64.b64decode(part["url"].split(";base64,", 1)[1]))
                    files.append(os.path.abspath(name))
                    parts.append({"type": "image"})
                else:
                    parts.append(part)
            content = parts
        converted.append({"role": message["role"], "content": content})
    return converted, files


def _context(folder: Path) -> int:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 2048
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    value = text.get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else 2048


def generate(request: dict[str, Any]) -> Generator[dict[str, Any], None, dict[str, Any]]:
    from mlx_vlm import load, stream_generate

    folder = Path(str(request["model"]))
    model, processor = load(str(folder))
    tokenizer = processor.tokenizer if hasattr(processor, "tokenizer") else processor
    files: list[str] = []
    if "messages" in request:
        messages, files = _images(request["messages"])
        if not getattr(processor, "chat_template", None):
            return {"refused": "this model has no chat template; use /v1/completions"}
        prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:
        prompt = str(request["prompt"])
    context = _context(folder)
    limit = request.get("max_tokens")
    budget = context if limit is None else min(int(limit), context)
    options: dict[str, Any] = {
        "max_tokens": budget,
        "temperature": float(request.get("temperature", 1.0)),
        "top_p": float(request.get("top_p", 1.0)),
    }
    if request.get("seed") is not None:
        options["seed"] = int(request["seed"]) % 2**32
    text = GeneratedText(
        lambda t: str(tokenizer.decode(t, skip_special_tokens=True)),
        [str(s) for s in request.get("stop") or []],
    )
    prompt_tokens = [0]

    def tokens() -> Generator[int, None, None]:
        for response in stream_generate(model, processor, prompt, image=files or None, **options):
            prompt_tokens[0] = int(response.prompt_tokens or 0)
            yield int(response.token)

    eos_ids = getattr(tokenizer, "eos_token_ids", None) or tokenizer.eos_token_id
    eos = set(eos_ids) if isinstance(eos_ids, list | set | tuple) else {eos_ids}
    yield from text.follow(tokens(), eos, budget)
    finish = "stop" if text.finish == "stop" or len(text.ids) < budget else "length"
    usage = {"prompt_tokens": prompt_tokens[0], "completion_tokens": len(text.ids)}
    return {"finish_reason": finish, "usage": usage}


if __name__ == "__main__":
    run_once(generate)
