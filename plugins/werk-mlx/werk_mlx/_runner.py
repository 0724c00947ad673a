"""Werk's MLX runner: mlx-lm, one process per request, speaking Werk's runner contract
(:mod:`werk.runner`). Run by the MLX python, never imported by Werk.

stdin: one JSON object — the model folder in ``model`` (a Hugging Face or MLX folder
``mlx_lm.load`` reads) and the generation arguments (``messages`` or ``prompt``,
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``return_token_ids``). stdout:
``{"delta": TEXT, "ids": [...]}`` lines, then ``{"done": true, ...}``; or
``{"error": TEXT[, "kind": "invalid"]}`` and exit status 1 (2 for ``invalid``) —
``werk_companion_frames.run_once`` speaks that part. The model is loaded for this request and
gone with the process: nothing is resident.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import GeneratedText, run_once


def _context(folder: Path) -> int:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 2048
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    return 2048


def generate(request: dict[str, Any]) -> Generator[dict[str, Any], None, dict[str, Any]]:
    """Load the model, stream the events, return the result (or ``{"refused": TEXT}``)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    folder = Path(str(request["model"]))
    model, tokenizer = load(str(folder))
    if "messages" in request:
        if not getattr(tokenizer, "chat_template", None):
            return {"refused": "this model has no chat template; use /v1/completions"}
        ids = list(tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True))
    else:
        ids = list(tokenizer.encode(str(request["prompt"])))
    context = _context(folder)
    if len(ids) >= context:
        return {"refused": f"the prompt has {len(ids)} tokens; this model's context is {context}"}
    limit = request.get("max_tokens")
    budget = context - len(ids) if limit is None else min(int(limit), context - len(ids))
    if request.get("seed") is not None:
        mx.random.seed(int(request["seed"]) % 2**32)
    temperature = float(request.get("temperature", 1.0))
    sampler = make_sampler(temp=temperature, top_p=float(request.get("top_p", 1.0)))
    text = GeneratedText(
        lambda t: str(tokenizer.decode(t, skip_special_tokens=True)),
        [str(s) for s in request.get("stop") or []],
    )
    steps = generate_step(mx.array(ids), model, max_tokens=budget, sampler=sampler)
    tokens = (int(token) for token, _ in steps)
    yield from text.follow(tokens, set(tokenizer.eos_token_ids), budget)
    result: dict[str, Any] = {
        "finish_reason": text.finish,
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(text.ids)},
    }
    if request.get("return_token_ids"):
        result["prompt_ids"] = ids
    return result


if __name__ == "__main__":
    run_once(generate)
