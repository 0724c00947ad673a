"""RFC 3339 UTC timestamps for wire shapes."""

from __future__ import annotations

import datetime as _dt

__all__ = ["rfc3339"]


def rfc3339(epoch_seconds: float) -> str:
    """``2026-12-02T14:32:21.123Z`` for a POSIX timestamp."""
    moment = _dt.datetime.fromtimestamp(epoch_seconds, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
