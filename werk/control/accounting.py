"""Verified-reuse accounting per principal and model (``GET /werk/v1/stats``, ``/metrics``).

Only the backend's own counts go in: the prompt and cached tokens of each Prefill's outcome,
and what became of each restore of a named state. In memory, since the server started.
"""

from __future__ import annotations

import enum
import threading
from collections import defaultdict
from collections.abc import Callable

import msgspec

from ..protocol.base import rfc3339
from ..protocol.stats import ModelReuse, RestoreCounts, StatsResponse

__all__ = ["RestoreResult", "ReuseAccounting"]


class RestoreResult(enum.Enum):
    VERIFIED = "verified"
    REFUSED = "refused"


class _Counts(msgspec.Struct):
    prefills: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    attempted: int = 0
    verified: int = 0
    refused: int = 0


class ReuseAccounting:
    """Thread-safe counters; :meth:`totals` feeds the metrics (no principal in them)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._since = clock()
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], _Counts] = defaultdict(_Counts)

    def prefill(
        self, principal: str, model: str, prompt_tokens: int, cached_tokens: int | None
    ) -> None:
        """One Prefill's outcome; ``cached_tokens`` ``None`` (the backend does not say) adds
        nothing to the reused tokens."""
        with self._lock:
            counts = self._counts[(principal, model)]
            counts.prefills += 1
            counts.prompt_tokens += max(0, prompt_tokens)
            counts.cached_tokens += max(0, cached_tokens or 0)

    def restore_attempted(self, principal: str, model: str) -> None:
        with self._lock:
            self._counts[(principal, model)].attempted += 1

    def restore_ended(self, principal: str, model: str, result: RestoreResult) -> None:
        with self._lock:
            counts = self._counts[(principal, model)]
            if result is RestoreResult.VERIFIED:
                counts.verified += 1
            else:
                counts.refused += 1

    def stats(self, principal: str) -> StatsResponse:
        """The caller's own figures, one entry per model it prefilled or restored on."""
        with self._lock:
            mine = sorted((m, c) for (p, m), c in self._counts.items() if p == principal)
            return StatsResponse(
                since=rfc3339(self._since),
                models=[
                    ModelReuse(
                        model=model,
                        prefills=c.prefills,
                        prompt_tokens=c.prompt_tokens,
                        cached_tokens=c.cached_tokens,
                        restores=RestoreCounts(
                            attempted=c.attempted, verified=c.verified, refused=c.refused
                        ),
                    )
                    for model, c in mine
                ],
            )

    def totals(self) -> dict[str, ModelReuse]:
        """Per model, summed over every principal (for ``/metrics``: no principal label)."""
        with self._lock:
            out: dict[str, _Counts] = defaultdict(_Counts)
            for (_, model), c in self._counts.items():
                t = out[model]
                t.prefills += c.prefills
                t.prompt_tokens += c.prompt_tokens
                t.cached_tokens += c.cached_tokens
                t.attempted += c.attempted
                t.verified += c.verified
                t.refused += c.refused
            return {
                model: ModelReuse(
                    model=model,
                    prefills=t.prefills,
                    prompt_tokens=t.prompt_tokens,
                    cached_tokens=t.cached_tokens,
                    restores=RestoreCounts(
                        attempted=t.attempted, verified=t.verified, refused=t.refused
                    ),
                )
                for model, t in sorted(out.items())
            }
