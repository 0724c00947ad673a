"""Werk's MLX runner: mlx-lm, one process per request, speaking Werk's runner contract
(:mod:`werk.runner`). Run by the MLX python, never imported by Werk.

stdin: one JSON object — the model folder in ``model`` (a Hugging Face or MLX folder
``mlx_lm.load`` reads) and the generation arguments (``messages`` or ``prompt``,
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``return_token_ids``). stdout:
``{"delta": TEXT, "ids": [...]}`` lines, then ``{"done": true, ...}``; or
``{"error": TEXT[, "kind": "invalid"]}`` and exit status 1 (2 for ``invalid``). The model is
loaded for this request and gone with the process: nothing is resident.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import GeneratedText


def _emit(line: dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(line) + "\n")
    sys.__stdout__.flush()


def _context(folder: Path) -> int:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 2048
    for key in ("max_position_embeddings", "n_positions", "seq_length"):
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    return 2048


def main() -> int:
    request = json.loads(sys.stdin.readline())
    sys.stdout = sys.stderr  # whatever the libraries print goes to the log
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    folder = Path(str(request["model"]))
    model, tokenizer = load(str(folder))
    if "messages" in request:
        if not getattr(tokenizer, "chat_template", None):
            _emit(
                {"error": "this model has no chat template; use /v1/completions", "kind": "invalid"}
            )
            return 2
        ids = list(tokenizer.apply_chat_template(request["messages"], add_generation_prompt=True))
    else:
        ids = list(tokenizer.encode(str(request["prompt"])))
    context = _context(folder)
    if len(ids) >= context:
        _emit({"error": f"the prompt has {len(ids)} tokens; this model's context is {context}",
               "kind": "invalid"})  # fmt: skip
        return 2
    limit = request.get("max_tokens")
    budget = context - len(ids) if limit is None else min(int(limit), context - len(ids))
    temperature = float(request.get("temperature", 1.0))
    if request.get("seed") is not None:
        mx.random.seed(int(request["seed"]) % 2**32)
    sampler = make_sampler(temp=temperature, top_p=float(request.get("top_p", 1.0)))
    text = GeneratedText(
        lambda t: str(tokenizer.decode(t, skip_special_tokens=True)),
        [str(s) for s in request.get("stop") or []],
    )
    eos = set(tokenizer.eos_token_ids)
    finish = "length"
    steps = generate_step(mx.array(ids), model, max_tokens=budget, sampler=sampler)
    for token, _ in steps:
        token = int(token)
        if token in eos:
            finish = "stop"
            break
        event = text.add(token)
        if event is not None:
            _emit({"delta": event["text"], "ids": event["ids"]})
        if text.stopped:
            finish = "stop"
            break
        if len(text.ids) >= budget:
            break
    rest = text.rest()
    if rest is not None:
        _emit({"delta": rest["text"], "ids": rest["ids"]})
    done: dict[str, Any] = {
        "done": True,
        "finish_reason": finish,
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(text.ids)},
    }
    if request.get("return_token_ids"):
        done["prompt_ids"] = ids
    _emit(done)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # reported on the protocol; the traceback goes to the log
        import traceback

        traceback.print_exc()
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
