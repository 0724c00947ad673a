"""Verified prefix reuse: only what the worker itself reports counts.

oMLX versions put the cached prompt tokens in two places: its ``Usage`` extension field
``usage.cached_tokens`` and OpenAI's ``usage.prompt_tokens_details.cached_tokens``. Werk reads
both (when both are there and disagree, the smaller counts) and answers in OpenAI's shape only:
``usage.prompt_tokens_details.cached_tokens``, ``0`` when the worker reported nothing. A request
counts as reused only when that figure is positive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ReuseCounter", "normalize_usage", "worker_cached_tokens"]


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def worker_cached_tokens(usage: Any) -> int | None:
    """The cached prompt tokens the worker reported, ``None`` when it reported none."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    found = [
        count
        for count in (
            _count(usage.get("cached_tokens")),
            _count(details.get("cached_tokens")) if isinstance(details, dict) else None,
        )
        if count is not None
    ]
    return min(found) if found else None


def normalize_usage(usage: dict[str, Any]) -> int:
    """Rewrite ``usage`` in place to OpenAI's shape; returns the verified cached tokens."""
    cached = worker_cached_tokens(usage) or 0
    usage.pop("cached_tokens", None)
    details = usage.get("prompt_tokens_details")
    usage["prompt_tokens_details"] = {
        **(details if isinstance(details, dict) else {}),
        "cached_tokens": cached,
    }
    return cached


@dataclass
class ReuseCounter:
    """Requests answered and how many of them the worker says reused a cached prefix."""

    requests: int = 0
    reused: int = 0
    cached_tokens: int = 0

    def record(self, cached: int) -> None:
        self.requests += 1
        if cached > 0:
            self.reused += 1
            self.cached_tokens += cached

    def summary(self) -> str:
        return (
            f"{self.reused} of {self.requests} request(s) reused a cached prefix "
            f"({self.cached_tokens} prompt tokens, as the worker reported)"
        )
