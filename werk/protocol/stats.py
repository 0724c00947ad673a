"""``GET /werk/v1/stats``: verified-reuse accounting of the caller's own prefills (an addition).

Every figure comes from the backend's own counts (for llama.cpp ``timings.cache_n``, never
``tokens_cached``), summed since the server started, for the calling principal only.
"""

from __future__ import annotations

from .base import Response

__all__ = ["ModelReuse", "RestoreCounts", "StatsResponse"]


class RestoreCounts(Response, frozen=True, kw_only=True):
    """Named states handed to the backend for reuse.

    ``attempted``: restores started; ``verified``: restored and the backend then reported reused
    tokens; ``refused``: the backend refused the state (``incompatible_state``) or reported no
    reuse after restoring it. A restore that failed with another error is attempted only.
    """

    attempted: int = 0
    verified: int = 0
    refused: int = 0


class ModelReuse(Response, frozen=True, kw_only=True):
    """One model's prefills: how many, their prompt tokens, and how many of those the backend
    reported as reused (``cached_tokens``)."""

    model: str
    prefills: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    restores: RestoreCounts = RestoreCounts()


class StatsResponse(Response, frozen=True, kw_only=True):
    since: str
    models: list[ModelReuse]
