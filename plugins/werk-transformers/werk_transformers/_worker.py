"""Werk's Transformers companion worker. Run by the worker's python (never imported by Werk).

It speaks the host's companion-worker protocol (``werk/_companion/werk_companion_frames.py``,
found through ``WERK_COMPANION_FRAMES``; :mod:`werk.companion`): one request at a time over
stdio, one JSON object per line, transport version 1.

Operations: ``health`` (versions, pid, resident models), ``capabilities`` (the LRU's capacity),
``probe-model`` (a model directory's architecture, context length and whether it has a chat
template; no weights are read), ``load`` (load a model into the LRU), ``execute`` (generate:
streamed ``{"text": DELTA}`` events, then ``finish_reason`` and ``usage``; a request this
worker refuses returns ``{"refused": TEXT}`` without ending it), ``unload``.

Generation is Transformers' own forward pass with its KV cache, one token at a time, in this
process: greedy when ``temperature`` is 0, else sampled (``temperature``, ``top_p``, ``seed``
for a reproducible draw). It stops at the model's end-of-sequence tokens, a ``stop`` string (not
included), ``max_tokens`` or the context length. Nothing is kept between requests but the
loaded models: the cache is generation-local.

Loaded models stay in an LRU of ``WERK_TRANSFORMERS_MODEL_CACHE_SIZE`` entries (default 1;
0 = nothing stays after a request). Evicting one drops every reference, runs ``gc.collect()`` and
glibc's ``malloc_trim(0)``. Each entry's size is the bytes of its parameters and buffers.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import (
    GeneratedText,
    LoadedLRU,
    RequestError,
    has_chat_template,
    serve,
)

CAUSAL_SUFFIX = "ForCausalLM"


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _config(path: str) -> dict[str, Any]:
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RequestError("invalid", f"{config_file} cannot be read: {exc}") from None
    if not isinstance(config, dict):
        raise RequestError("invalid", f"{config_file} is not a JSON object")
    return config


def _architecture(config: dict[str, Any]) -> str:
    architectures = config.get("architectures") or []
    causal = [a for a in architectures if isinstance(a, str) and a.endswith(CAUSAL_SUFFIX)]
    if not causal:
        raise RequestError(
            "invalid",
            f"not a text-generation model: its architectures are {architectures!r} "
            f"(the transformers backend serves *{CAUSAL_SUFFIX} models)",
        )
    return causal[0]


def _context_length(config: dict[str, Any]) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


class Loaded:
    """A model, its tokenizer and what generation needs from them."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = _config(path)
        _architecture(config)
        self.context = _context_length(config)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.bytes = sum(t.numel() * t.element_size() for t in self.model.parameters()) + sum(
            t.numel() * t.element_size() for t in self.model.buffers()
        )


def _load(path: str) -> tuple[Loaded, dict[str, Any]]:
    started = time.monotonic()
    loaded = Loaded(path)
    seconds = round(time.monotonic() - started, 3)
    return loaded, {"bytes": loaded.bytes, "load_seconds": seconds}


MODELS = LoadedLRU(int(os.environ.get("WERK_TRANSFORMERS_MODEL_CACHE_SIZE", "1")), _load, _trim)


def _prompt_ids(loaded: Loaded, args: dict[str, Any]) -> list[int] | str:
    """The prompt's token ids, or why they cannot be made."""
    tokenizer = loaded.tokenizer
    if "messages" in args:
        if not tokenizer.chat_template:
            return "this model has no chat template; use /v1/completions"
        try:
            text = tokenizer.apply_chat_template(
                args["messages"], tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # the template refused these messages (roles, order…)
            return f"the model's chat template refused the messages: {exc}"
        return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])
    return list(tokenizer(str(args["prompt"]))["input_ids"])


def _pick(logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    import torch

    if temperature <= 0:
        return int(torch.argmax(logits))
    probabilities = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        ordered, order = torch.sort(probabilities, descending=True)
        keep = torch.cumsum(ordered, dim=-1) - ordered < top_p
        probabilities = torch.zeros_like(probabilities).scatter(0, order[keep], ordered[keep])
    return int(torch.multinomial(probabilities, 1, generator=generator))


def _generate(args: dict[str, Any]) -> Generator[dict[str, Any], None, dict[str, Any]]:
    import torch

    loaded: Loaded = MODELS.get(str(args["path"]))
    ids = _prompt_ids(loaded, args)
    if isinstance(ids, str):
        MODELS.after_request()
        return {"refused": ids, "resident": MODELS.resident()}
    room = loaded.context - len(ids)
    if room <= 0:
        MODELS.after_request()
        refused = f"the prompt has {len(ids)} tokens; this model's context is {loaded.context}"
        return {"refused": refused, "resident": MODELS.resident()}
    limit = args.get("max_tokens")
    budget = room if limit is None else min(int(limit), room)
    temperature = float(args.get("temperature", 1.0))
    top_p = float(args.get("top_p", 1.0))
    seed = args.get("seed")
    generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    stops = [str(s) for s in args.get("stop") or []]
    text = GeneratedText(lambda t: str(loaded.tokenizer.decode(t, skip_special_tokens=True)), stops)

    def tokens() -> Iterator[int]:
        """Transformers' forward pass with its KV cache, one token at a time."""
        step_input, past = torch.tensor([ids]), None
        with torch.inference_mode():
            while True:
                out = loaded.model(input_ids=step_input, past_key_values=past, use_cache=True)
                past = out.past_key_values
                token = _pick(out.logits[0, -1].float(), temperature, top_p, generator)
                yield token
                step_input = torch.tensor([[token]])

    try:
        yield from text.follow(tokens(), loaded.eos, budget)
    finally:
        MODELS.after_request()
    usage = {"prompt_tokens": len(ids), "completion_tokens": len(text.ids)}
    result = {"finish_reason": text.finish, "usage": usage, "resident": MODELS.resident()}
    if args.get("return_token_ids"):
        result["prompt_ids"] = ids
    return result


def _versions() -> dict[str, str]:
    versions = {}
    for name in ("torch", "transformers", "tokenizers"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def handle(op: str, args: dict[str, Any]) -> dict[str, Any] | Iterator[dict[str, Any]]:
    if op == "health":
        return {"pid": os.getpid(), "versions": _versions(), "resident": MODELS.resident()}
    if op == "capabilities":
        return {"cache_size": MODELS.capacity}
    if op == "probe-model":
        config = _config(str(args["path"]))
        return {
            "architecture": _architecture(config),
            "context_length": _context_length(config),
            "chat_template": has_chat_template(str(args["path"])),
        }
    if op == "load":
        MODELS.get(str(args["path"]))
        MODELS.after_request()
        return {"resident": MODELS.resident()}
    if op == "execute":
        return _generate(args)
    if op == "unload":
        return {"unloaded": MODELS.drop(str(args["path"])), "resident": MODELS.resident()}
    raise RequestError("unsupported", f"unknown operation {op!r}")


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    serve(handle, cancel_result=lambda: {"resident": MODELS.resident()})
