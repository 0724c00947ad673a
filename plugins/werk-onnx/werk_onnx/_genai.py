"""Text generation with ONNX Runtime GenAI, shared by the companion worker (``_worker.py``) and
the reference runner (``_runner.py``). Run by the onnx environment's python, never imported by
Werk.

A model is a folder written by ONNX Runtime GenAI's model builder (``genai_config.json``, the
decoder's ``.onnx`` and its data, the tokenizer, a chat template). Each request gets a new
``og.Generator`` and prompt state: nothing is kept between requests but the loaded model.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import GeneratedText, has_chat_template


class Loaded:
    """A model folder's ``og.Model`` and ``og.Tokenizer``, and what generation needs."""

    def __init__(self, path: str) -> None:
        import onnxruntime_genai as og

        config = json.loads((Path(path) / "genai_config.json").read_text(encoding="utf-8"))
        model = config.get("model") or {}
        self.context = int(model.get("context_length") or 2048)
        eos = model.get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.model = og.Model(path)
        self.tokenizer = og.Tokenizer(self.model)
        self.template = has_chat_template(path)
        self.bytes = sum(
            p.stat().st_size for p in Path(path).iterdir() if p.name.endswith((".onnx", ".data"))
        )


class _Decoded:
    """``decode(ids)`` through the tokenizer's stream: ONNX Runtime GenAI's ``decode`` of a
    whole list stops at the first invalid UTF-8 sequence (a random model makes them); its
    stream drops such bytes and goes on."""

    def __init__(self, loaded: Loaded) -> None:
        self._stream = loaded.tokenizer.create_stream()
        self._pieces: list[str] = []

    def __call__(self, ids: list[int]) -> str:
        for token in ids[len(self._pieces) :]:
            self._pieces.append(str(self._stream.decode(token)))
        return "".join(self._pieces)


def prompt_ids(loaded: Loaded, args: dict[str, Any]) -> list[int] | str:
    """The prompt's token ids, or why they cannot be made."""
    if "messages" in args:
        if not loaded.template:
            return "this model has no chat template; use /v1/completions"
        try:
            text = loaded.tokenizer.apply_chat_template(
                messages=json.dumps(args["messages"]), add_generation_prompt=True
            )
        except Exception as exc:  # the template refused these messages
            return f"the model's chat template refused the messages: {exc}"
    else:
        text = str(args["prompt"])
    return [int(i) for i in loaded.tokenizer.encode(text)]


def generate(
    loaded: Loaded, args: dict[str, Any]
) -> Generator[dict[str, Any], None, dict[str, Any]]:
    """Stream ``{"text", "ids"}`` events; return ``finish_reason`` and ``usage`` (or
    ``{"refused": TEXT}`` for a request this model cannot take)."""
    import numpy as np
    import onnxruntime_genai as og

    ids = prompt_ids(loaded, args)
    if isinstance(ids, str):
        return {"refused": ids}
    room = loaded.context - len(ids)
    if room <= 0:
        return {
            "refused": f"the prompt has {len(ids)} tokens; this model's context is {loaded.context}"
        }
    limit = args.get("max_tokens")
    budget = room if limit is None else min(int(limit), room)
    temperature = float(args.get("temperature", 1.0))
    options: dict[str, Any] = {"max_length": len(ids) + budget, "do_sample": temperature > 0}
    if temperature > 0:
        options.update(temperature=temperature, top_p=float(args.get("top_p", 1.0)), top_k=0)
        if args.get("seed") is not None:
            options["random_seed"] = int(args["seed"]) % 2**31
    params = og.GeneratorParams(loaded.model)
    params.set_search_options(**options)
    generator = og.Generator(loaded.model, params)
    generator.append_tokens(np.array(ids, dtype=np.int32))
    text = GeneratedText(_Decoded(loaded), [str(s) for s in args.get("stop") or []])

    def tokens() -> Iterator[int]:
        while not generator.is_done():
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0])

    yield from text.follow(tokens(), loaded.eos, budget)
    result: dict[str, Any] = {
        "finish_reason": text.finish,
        "usage": {"prompt_tokens": len(ids), "completion_tokens": len(text.ids)},
    }
    if args.get("return_token_ids"):
        result["prompt_ids"] = ids
    return result
