"""The model options of ``llamacpp-inproc`` (``werk models import --option KEY=VALUE``).

* ``ctx_size`` (default 2048): the context of the model's one sequence, in tokens.
* ``batch_size`` (default 512): tokens per llama.cpp decode call while evaluating a prompt.
* ``threads`` (default 0: every core Werk may use): llama.cpp's compute threads.
* ``session_cache_mb`` (default 256; 0 turns it off) and ``session_entries`` (default 8): the
  chat-session cache's bounds (``sessions.py``); the byte bound is also never more than
  ``session_entries`` whole-context sequences take, so a small model reserves little.

``ctx_size``, ``batch_size`` and the KV cache types (f16, llama.cpp's default) decide whether a
saved state fits this context: they are the runtime arguments of every state's envelope.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import msgspec

from werk import InvalidRequest

__all__ = ["InprocOptions", "parse_inproc_options"]

_BOUNDS: dict[str, tuple[int, int, int]] = {
    "ctx_size": (2048, 64, 1 << 20),
    "batch_size": (512, 1, 8192),
    "threads": (0, 0, 1024),
    "session_cache_mb": (256, 0, 1 << 16),
    "session_entries": (8, 0, 256),
}


class InprocOptions(msgspec.Struct, frozen=True):
    ctx_size: int
    batch_size: int
    threads: int
    session_cache_mb: int
    session_entries: int

    @property
    def compute_threads(self) -> int:
        return self.threads or max(1, len(os.sched_getaffinity(0)))

    def session_bytes(self, context_state_bytes: int) -> int:
        """The session cache's byte bound: ``session_cache_mb``, but never more than
        ``session_entries`` sequences of a whole context (``context_state_bytes``: the KV cache
        of ``ctx_size`` tokens) can take."""
        return min(self.session_cache_mb << 20, self.session_entries * context_state_bytes)

    def runtime_args(self) -> tuple[str, ...]:
        """The settings a saved state depends on, in a fixed order (the envelope's args)."""
        return (
            f"n_ctx={self.ctx_size}",
            f"n_batch={self.batch_size}",
            "type_k=f16",
            "type_v=f16",
            "seq_id=0",
        )


def parse_inproc_options(options: Mapping[str, Any]) -> InprocOptions:
    """:raises werk.InvalidRequest: an unknown key or a value out of its range."""
    unknown = sorted(set(options) - set(_BOUNDS))
    if unknown:
        raise InvalidRequest(
            f"unknown llamacpp-inproc model option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(_BOUNDS))}"
        )
    values: dict[str, int] = {}
    for key, (default, low, high) in _BOUNDS.items():
        value = options.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InvalidRequest(
                f"llamacpp-inproc model option {key!r} must be an integer in [{low}, {high}]"
            )
        values[key] = value
    return InprocOptions(**values)
