"""The recent-request tail the dashboard shows: the last exchanges, each kept with its caller.

:class:`werk.http.exchange.ExchangeMiddleware` records every finished exchange that an API key
(or the local mode) was admitted for; the dashboard shows a caller only its own entries. An
entry holds what the access log holds (time, method, path, status, model, duration), never a
body, a header or a key. The tail is bounded (:data:`ACTIVITY_ENTRIES`) and lives in memory.
"""

from __future__ import annotations

import collections
import time

import msgspec
from starlette.types import Scope

__all__ = ["ACTIVITY_ENTRIES", "Activity", "ActivityEntry"]

ACTIVITY_ENTRIES = 500
"""How many recent exchanges the server keeps, for all callers together."""

_SKIPPED_PREFIXES = ("/dashboard",)  # the dashboard's own stream and assets


class ActivityEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One finished exchange."""

    at: str
    method: str
    path: str
    status: int
    model: str | None
    milliseconds: float


class Activity:
    """A bounded tail of recent exchanges by principal. Recording is on every request's path,
    so it keeps the raw fields only; :meth:`recent` shapes them for the page."""

    def __init__(self, size: int = ACTIVITY_ENTRIES) -> None:
        self._entries: collections.deque[tuple[str, float, str, str, int, object, float]] = (
            collections.deque(maxlen=size)
        )

    def record(self, scope: Scope, status: int, seconds: float) -> None:
        """Keep one exchange (a no-op for one nobody was admitted for, and the dashboard's own)."""
        principal = scope.get("werk_principal")
        path = str(scope.get("path", ""))
        if not isinstance(principal, str) or path == "/" or path.startswith(_SKIPPED_PREFIXES):
            return
        method = str(scope.get("method", ""))
        model = scope.get("werk_model")
        self._entries.append((principal, time.time(), method, path, status, model, seconds))

    def recent(self, principal: str, limit: int = 30) -> list[ActivityEntry]:
        """``principal``'s most recent exchanges, newest first."""
        found: list[ActivityEntry] = []
        for owner, at, method, path, status, model, seconds in reversed(self._entries):
            if owner != principal:
                continue
            found.append(
                ActivityEntry(
                    at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
                    method=method,
                    path=path[:200],
                    status=status,
                    model=model[:128] if isinstance(model, str) else None,
                    milliseconds=round(seconds * 1e3, 1),
                )
            )
            if len(found) == limit:
                break
        return found
