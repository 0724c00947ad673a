"""Werk's ONNX Runtime GenAI companion worker. Run by the onnx environment's python (never
imported by Werk).

It speaks the host's companion-worker protocol (``werk/_companion/werk_companion_frames.py``;
:mod:`werk.companion`). Operations: ``health`` (versions, pid, resident models),
``capabilities`` (the LRU's capacity), ``probe-model`` (a model folder's type, context length,
chat template, read from ``genai_config.json``), ``load``, ``execute`` (streamed ``{"text",
"ids"}`` events, then ``finish_reason`` and ``usage``; ``{"refused": TEXT}`` for a request the
model cannot take, the worker stays), ``unload``.

Loaded models (``og.Model`` and ``og.Tokenizer``) stay in an LRU of
``WERK_ONNX_GENAI_MODEL_CACHE_SIZE`` entries (default 1; 0 = none after a request); each
request gets a new generator and prompt state. An entry's size is its ONNX files' bytes.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from _genai import Loaded, generate
from werk_companion_frames import LoadedLRU, RequestError, serve


def _load(path: str) -> tuple[Loaded, dict[str, Any]]:
    started = time.monotonic()
    loaded = Loaded(path)
    return loaded, {"bytes": loaded.bytes, "load_seconds": round(time.monotonic() - started, 3)}


MODELS = LoadedLRU(int(os.environ.get("WERK_ONNX_GENAI_MODEL_CACHE_SIZE", "1")), _load, gc.collect)


def _probe(path: str) -> dict[str, Any]:
    config_file = Path(path) / "genai_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RequestError("invalid", f"{config_file} cannot be read: {exc}") from None
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        raise RequestError("invalid", f"{config_file} has no 'model' object")
    return {
        "architecture": str(model.get("type", "?")),
        "context_length": int(model.get("context_length") or 2048),
    }


def _execute(args: dict[str, Any]) -> Generator[dict[str, Any], None, dict[str, Any]]:
    try:
        loaded = MODELS.get(str(args["path"]))
        result = yield from generate(loaded, args)
    finally:
        MODELS.after_request()
    return result | {"resident": MODELS.resident()}


def _versions() -> dict[str, str]:
    versions = {}
    for name in ("onnxruntime-genai", "onnxruntime", "numpy"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def handle(op: str, args: dict[str, Any]) -> dict[str, Any] | Generator[dict[str, Any], None, Any]:
    if op == "health":
        return {"pid": os.getpid(), "versions": _versions(), "resident": MODELS.resident()}
    if op == "capabilities":
        return {"cache_size": MODELS.capacity}
    if op == "probe-model":
        return _probe(str(args["path"]))
    if op == "load":
        MODELS.get(str(args["path"]))
        MODELS.after_request()
        return {"resident": MODELS.resident()}
    if op == "execute":
        return _execute(args)
    if op == "unload":
        return {"unloaded": MODELS.drop(str(args["path"])), "resident": MODELS.resident()}
    raise RequestError("unsupported", f"unknown operation {op!r}")


if __name__ == "__main__":
    serve(handle, cancel_result=lambda: {"resident": MODELS.resident()})
