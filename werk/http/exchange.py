"""One ASGI middleware for what every HTTP exchange gets: its request id, the connection rules
about request bodies, and its count and duration in ``/metrics``.

One wrapper rather than three: every ``send`` of a reply (each SSE event of a stream included)
passes through it once.

* **Request id.** Every exchange gets a fresh ``X-Werk-Request-Id`` (client-supplied values are
  ignored and removed from the response); :func:`werk.http.requests.current_request_id` and the
  log filter see it.
* **Request framing.** A request that carries both ``Content-Length`` and
  ``Transfer-Encoding`` is refused (400): RFC 9112 §6.3 calls the combination a
  request-smuggling shape and requires a close after answering. (llhttp, uvicorn's parser,
  refuses it too; this rule does not depend on the parser.) A response sent while the request
  body was not read to its end (413 before reading, 401, 415, …) says ``Connection: close`` and
  the connection is closed after it: the client may still be sending a body nobody will read,
  and a client must not reuse a connection in that state.
* **Shutdown.** A request still running when a stopping server's grace period ends is
  cancelled with one log line (no traceback).
* **Metrics, the access log and the activity tail.** Counted and timed by the route template
  Starlette matched (``unmatched`` when none did), until the last body byte was sent; one
  access-log line (:mod:`werk.http.access`); one entry in the dashboard's activity tail
  (:mod:`werk.http.activity`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..protocol import InvalidRequest
from .access import log_exchange
from .activity import Activity
from .errors import error_response
from .metrics import HttpMetrics
from .requests import REQUEST_ID_HEADER, new_request_id, set_request_id

__all__ = ["GRACEFUL_SHUTDOWN_SECONDS", "ExchangeMiddleware"]

log = logging.getLogger("werk.http")

GRACEFUL_SHUTDOWN_SECONDS = 10.0
"""How long a stopping server lets running requests finish before it cancels them (the
default of ``werk serve --shutdown-grace``)."""

_CLOSE = (b"connection", b"close")


class ExchangeMiddleware:
    """Request id, request-framing rules and HTTP metrics for every ``http`` exchange."""

    def __init__(
        self, app: ASGIApp, metrics: HttpMetrics, activity: Activity | None = None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.activity = activity

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = new_request_id()
        scope["werk_request_id"] = request_id
        set_request_id(request_id)
        id_header = (REQUEST_ID_HEADER, request_id.encode())
        status = 500
        chunked = length = None
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"transfer-encoding":
                chunked = value
            elif name == b"content-length":
                length = value
        body_read = chunked is None and (length is None or length.strip() == b"0")

        async def exchange_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                headers.append(id_header)
                if not body_read:
                    headers.append(_CLOSE)
                message["headers"] = headers
            await send(message)

        try:
            if chunked is not None and length is not None:
                refusal = InvalidRequest(
                    "a request must not carry both Content-Length and Transfer-Encoding"
                )
                await error_response(Request(scope), refusal)(scope, receive, exchange_send)
            elif body_read:
                await self.app(scope, receive, exchange_send)  # no body to leave unread
            else:

                async def tracking_receive() -> Message:
                    nonlocal body_read
                    message = await receive()
                    if message["type"] == "http.request" and not message.get("more_body", False):
                        body_read = True
                    return message

                await self.app(scope, tracking_receive, exchange_send)
        except asyncio.CancelledError:
            # Only a shutdown cancels a request's task (uvicorn, once its graceful bound has
            # passed; a client that leaves is not a cancellation): one line, no traceback.
            log.warning(
                "%s %s cancelled: the server is shutting down and the grace period for "
                "running requests (--shutdown-grace) has ended",
                scope.get("method", ""),
                scope.get("path", ""),
            )
            status = 503
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            seconds = time.perf_counter() - started
            self.metrics.observe(route, str(scope.get("method", "")), status, seconds)
            log_exchange(scope, status, seconds, request_id)
            if self.activity is not None:
                self.activity.record(scope, status, seconds)
