"""Serving the ASGI app with uvicorn, with a deadline for slow request headers.

uvicorn's keep-alive timer covers idle connections but not a client that trickles its request
headers (slowloris). :class:`HeaderDeadlineProtocol` closes any connection whose request line and
headers are not complete within ``header_timeout`` seconds of its first byte (or of the
connection opening), while requests already being served are unaffected.

A request h11 cannot parse (bad framing, garbage after a short ``Content-Length``) is answered
with the protocol's JSON error body and a request id, not uvicorn's plain-text page. (Closing a
connection whose request body was left unread is
:class:`werk.http.requests.RequestFramingMiddleware`'s job.)
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..protocol import InvalidRequest, encode
from .requests import REQUEST_ID_HEADER, RequestIdFilter, new_request_id

__all__ = ["HeaderDeadlineProtocol", "make_server"]

HEADER_TIMEOUT_SECONDS = 10.0
"""Default request-header deadline (``werk serve --header-timeout``)."""


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
        if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm()  # ... unless part of the next request is already buffered

    def send_400_response(self, msg: str) -> None:
        """Answer an unparseable request with the JSON error body, then close."""
        request_id = new_request_id()
        body = encode(InvalidRequest("malformed HTTP request").to_body(request_id))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (REQUEST_ID_HEADER, request_id.encode()),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event))
        self.transport.close()

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


def configure_logging(level: str = "warning") -> None:
    """Send ``werk.*`` log records (plugins' included) to stderr with their request id."""
    logger = logging.getLogger("werk")
    if any(isinstance(f, RequestIdFilter) for h in logger.handlers for f in h.filters):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(
        logging.Formatter("werk: %(levelname)s [%(request_id)s] %(name)s: %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(level.upper() if level.upper() in logging.getLevelNamesMapping() else "WARNING")


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
