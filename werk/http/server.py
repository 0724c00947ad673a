"""Serving the ASGI app with uvicorn's ``httptools`` protocol, with a deadline for slow
request headers and a bound on their size.

uvicorn's keep-alive timer covers idle connections but not a client that trickles its request
headers (slowloris). :class:`HeaderDeadlineProtocol` closes any connection whose request line and
headers are not complete within ``header_timeout`` seconds of its first byte (or of the
connection opening), while requests already being served are unaffected. llhttp (the parser
inside ``httptools``) sets no bound on a request head, so the protocol refuses one whose request
line and headers exceed :data:`MAX_HEAD_BYTES`.

A request the parser cannot take (bad framing, garbage after a short ``Content-Length``, both
``Content-Length`` and ``Transfer-Encoding``, an oversized head) is answered with the
protocol's JSON error body and a request id, not uvicorn's plain-text page, and the connection
is closed. (Closing a connection whose request body was left unread is
:class:`werk.http.exchange.ExchangeMiddleware`'s job.)

``httptools`` rather than uvicorn's pure-Python ``h11`` protocol: in two alternating pairs of
``benchmarks/llamacpp_proxy_overhead.py`` runs, ``werk serve`` spent 0.1--0.2 ms less CPU per
short chat (0.25--0.4 ms per streamed one) and the streamed first byte came 0.3--0.4 ms sooner
(docs/performance.md, "Proxy overhead").
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..protocol import InvalidRequest, encode
from .exchange import GRACEFUL_SHUTDOWN_SECONDS
from .requests import REQUEST_ID_HEADER, RequestIdFilter, new_request_id

__all__ = ["MAX_HEAD_BYTES", "HeadWithFirstBody", "HeaderDeadlineProtocol", "make_server"]

HEADER_TIMEOUT_SECONDS = 10.0
"""Default request-header deadline (``werk serve --header-timeout``)."""

MAX_HEAD_BYTES = 64 * 1024
"""The most bytes of request target, header names and header values one request may carry."""


class HeadTooLarge(Exception):
    """Raised inside a parser callback; the parser turns it into a parse error (a 400)."""


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's ``httptools`` protocol with a request-header deadline and size bound."""

    header_timeout: float = HEADER_TIMEOUT_SECONDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._head_started: float | None = None  # loop time of an unfinished head's first byte
        self._refused = False  # a parse error waits for the request before it (send_400_response)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is closed at the deadline too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if (
            self._head_started is not None
            and self._header_timer is None
            and not self.transport.is_closing()
        ):
            # A head that did not arrive whole: its deadline runs from its first byte. (One that
            # did, the usual case, never costs a timer.)
            deadline = self._head_started + self.header_timeout
            self._header_timer = self.loop.call_at(deadline, self._expire)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._head_started = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge(f"request head over {MAX_HEAD_BYTES} bytes")
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        # Inline, not a shared helper: this runs for every header of every request.
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge(f"request head over {MAX_HEAD_BYTES} bytes")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_started = None
        self._disarm()  # the keep-alive timer governs the connection from here on
        previous = self.cycle
        super().on_headers_complete()
        cycle = self.cycle  # created just now (its ASGI task has not run yet), unless upgraded
        if cycle is not None and cycle is not previous:
            cycle.transport = HeadWithFirstBody(self.transport, self.loop)  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        queued = bool(self.pipeline)
        super().on_response_complete()
        if self._refused and not queued:
            self._refuse()

    def send_400_response(self, msg: str) -> None:
        """Answer an unparseable request with the JSON error body, then close.

        Bytes after a complete request (garbage after a short ``Content-Length``) are refused
        only after that request and any complete one queued behind it are answered, as h11
        did; reading stops meanwhile. A request whose own head or body broke is refused at once.
        """
        self._disarm()
        self._head_started = None  # no deadline for what will not be parsed
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not cycle.response_complete:
            self._refused = True
            self.flow.pause_reading()
            return
        self._refuse()

    def _refuse(self) -> None:
        self._refused = False
        if self.transport.is_closing():
            return
        request_id = new_request_id()
        body = encode(InvalidRequest("malformed HTTP request").to_body(request_id))
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\n"
            b"connection: close\r\n"
            b"%s: %s\r\n\r\n%s" % (len(body), REQUEST_ID_HEADER, request_id.encode(), body)
        )
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
        self._head_started = None
        if not self.transport.is_closing():
            self.transport.close()


class HeadWithFirstBody:
    """The transport one request's response is written through: the response head waits for
    the first body bytes written in the same event-loop pass, and both go in one write.

    uvicorn writes a response's head and each body part separately; a plain reply sends its
    head and body back to back, so that is two socket writes (and two wake-ups of the client)
    where one does. A head whose body does not follow at once (a stream waiting for its first
    event) is written on its own at the end of the pass, as before. An interim ``100
    Continue`` is never held: the client waits for it before it sends the body.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
        elif data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 100 "):
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


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


class _StoppingServer(uvicorn.Server):
    """uvicorn's server that first tells the app it is stopping (``on_stop``), so that
    endless streams (the dashboard's) end at once instead of holding the shutdown grace."""

    on_stop: Callable[[], None] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.on_stop is not None:
            self.on_stop()
        await super().shutdown(sockets)


def make_server(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    header_timeout: float = HEADER_TIMEOUT_SECONDS,
    log_level: str = "warning",
    shutdown_grace: float = GRACEFUL_SHUTDOWN_SECONDS,
    on_stop: Callable[[], None] | None = None,
) -> uvicorn.Server:
    """A uvicorn server for ``app``; ``server.run()`` handles SIGINT/SIGTERM gracefully, and
    calls ``on_stop`` first when it begins to stop."""
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
        timeout_graceful_shutdown=math.ceil(shutdown_grace),
    )
    server = _StoppingServer(config)
    server.on_stop = on_stop
    return server
