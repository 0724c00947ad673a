"""The dashboard's live updates: one server-sent events stream per open page.

Why a stream and not polling: the page shows seven panels; polling them means seven requests
(and seven access-log lines) every couple of seconds per open tab, where one stream is one
request and one log line when it ends. Each stream sends a ``snapshot`` event (the whole
picture, :class:`~werk.http.dashboard.snapshot.Snapshots`) every :data:`INTERVAL_SECONDS`; the
events themselves are the heartbeat (a proxy or the browser sees traffic at least that often).

Bounds: a stream lives at most :data:`LIFETIME_SECONDS` (the browser's ``EventSource``
reconnects by itself, ``retry`` below); one caller has at most :data:`PER_CALLER` streams and
the server :data:`TOTAL` — opening one more ends the oldest (it gets an ``ended`` event saying
why, so that page stops reconnecting), it never refuses the new one. A stream ends when its
client disconnects and at once when the server begins to stop (not after the shutdown grace
period that running requests get).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio

from ...protocol import encode
from ..errors import to_werk_error
from .snapshot import Snapshots

__all__ = ["INTERVAL_SECONDS", "LIFETIME_SECONDS", "PER_CALLER", "TOTAL", "EventStreams"]

INTERVAL_SECONDS = 2.0
LIFETIME_SECONDS = 600.0
PER_CALLER = 4
TOTAL = 64
RETRY_MILLISECONDS = 3000


class _Stream:
    __slots__ = ("ended", "principal", "why")

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.ended = anyio.Event()
        self.why: str | None = None

    def end(self, why: str) -> None:
        if self.why is None:
            self.why = why
        self.ended.set()


class EventStreams:
    """The open dashboard streams of one server."""

    def __init__(
        self,
        *,
        interval: float = INTERVAL_SECONDS,
        lifetime: float = LIFETIME_SECONDS,
        per_caller: int = PER_CALLER,
        total: int = TOTAL,
    ) -> None:
        self.interval = interval
        self.lifetime = lifetime
        self.per_caller = per_caller
        self.total = total
        self._open: list[_Stream] = []  # oldest first
        self._stopping = False

    def __len__(self) -> int:
        return len(self._open)

    def stop(self) -> None:
        """End every stream now (the server is stopping); later streams end at once."""
        self._stopping = True
        for stream in list(self._open):
            stream.end("the server is stopping")

    def _admit(self, principal: str) -> _Stream:
        mine = [s for s in self._open if s.principal == principal]
        for old in mine[: max(0, len(mine) - self.per_caller + 1)]:
            old.end("a newer dashboard page of this API key replaced this one")
            self._open.remove(old)
        while len(self._open) >= self.total:
            self._open.pop(0).end("the server has too many dashboard pages open")
        stream = _Stream(principal)
        self._open.append(stream)
        if self._stopping:
            stream.end("the server is stopping")
        return stream

    def _release(self, stream: _Stream) -> None:
        if stream in self._open:
            self._open.remove(stream)

    def events(self, principal: str, snapshots: Snapshots) -> AsyncIterator[bytes]:
        """The SSE body of one stream for ``principal``. It counts as open from its first
        chunk until it ends (a body never iterated holds nothing)."""

        async def body() -> AsyncIterator[bytes]:
            stream = self._admit(principal)
            try:
                yield f"retry: {RETRY_MILLISECONDS}\n\n".encode()
                deadline = time.monotonic() + self.lifetime
                while not stream.ended.is_set() and time.monotonic() < deadline:
                    try:
                        update = encode(await snapshots.next())
                        yield b"event: snapshot\ndata: " + update + b"\n\n"
                    except Exception as exc:
                        error = to_werk_error(exc, "dashboard")
                        message = encode({"message": error.message})
                        yield b"event: problem\ndata: " + message + b"\n\n"
                    with anyio.move_on_after(self.interval):
                        await stream.ended.wait()
                if stream.why is not None:
                    yield b"event: ended\ndata: " + encode({"message": stream.why}) + b"\n\n"
            finally:
                self._release(stream)

        return body()
