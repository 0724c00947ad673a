"""Serving the ASGI app with uvicorn, with a deadline for slow request headers.

uvicorn's keep-alive timer covers idle connections but not a client that trickles its request
headers (slowloris). :class:`HeaderDeadlineProtocol` closes any connection whose request line and
headers are not complete within ``header_timeout`` seconds of its first byte (or of the
connection opening), while requests already being served are unaffected.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["HeaderDeadlineProtocol", "make_server"]

HEADER_TIMEOUT_SECONDS = 10.0


class HeaderDeadlineProtocol(H11Protocol):
    """An h11 protocol that enforces a request-header deadline."""

    header_timeout: float = HEADER_TIMEOUT_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._arm()
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._disarm()  # the keep-alive timer now governs the idle connection

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expire(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def make_server(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    header_timeout: float = HEADER_TIMEOUT_SECONDS,
    log_level: str = "warning",
) -> uvicorn.Server:
    """A uvicorn server for ``app``; ``server.run()`` handles SIGINT/SIGTERM gracefully."""
    protocol = type(
        "WerkH11Protocol", (HeaderDeadlineProtocol,), {"header_timeout": header_timeout}
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol,
        lifespan="on",
        log_level=log_level,
        access_log=False,
        server_header=False,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=10,
        h11_max_incomplete_event_size=64 * 1024,
    )
    return uvicorn.Server(config)
