"""What ``werk ps`` shows of the runtime manager: the loaded runtimes and those being
started."""

from __future__ import annotations

import msgspec

from ..backends import Runtime

__all__ = ["LoadingEntry", "RuntimeEntry"]


class RuntimeEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One loaded runtime as ``werk ps`` shows it.

    :ivar started_at: wall-clock seconds when it was started.
    :ivar busy: uses in progress (requests, streams, prefills…).
    :ivar idle_until: wall-clock seconds when it will be unloaded if nothing uses it; ``None``
        while busy or when its keep-alive is "never".
    :ivar keep_alive: the keep-alive that applies when it next goes idle (``None``: never).
    :ivar reserved: the bytes reserved for it (its requirement), ``None`` when unaccounted.
    """

    runtime: Runtime
    started_at: float
    busy: int
    idle_until: float | None
    keep_alive: float | None
    reserved: int | None = None


class LoadingEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A runtime being started, as ``werk ps`` shows it.

    :ivar phase: ``reserving memory`` (waiting for room), ``opening files`` (file leases) or
        ``starting`` (the backend loads the model and waits for its readiness).
    :ivar since: wall-clock seconds when the start began.
    :ivar waiting: requests waiting for this start (the one that began it included).
    """

    model: str
    backend: str
    phase: str
    since: float
    waiting: int
