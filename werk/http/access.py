"""The access log: one line per HTTP exchange, written when its last byte was sent.

``werk serve`` logs every request at the default level (``--quiet`` turns it off), as Ollama
and llama-server do::

    werk: 2026-12-05T16:30:01Z 200 POST /v1/chat/completions model=demo 12.3ms 127.0.0.1 req_…

Fields: UTC time, status, method, path (no query string: it may carry a cursor), the model the
request named (``-`` when it named none), the duration until the last body byte (a stream's
whole length), the client's address and the request id (``X-Werk-Request-Id``). Never a body,
a header or a key. The lines go to stderr through the ``werk.access`` logger, which routes can
leave alone: they record the model with :func:`note_model`.
"""

from __future__ import annotations

import logging
import sys
import time

from starlette.requests import Request
from starlette.types import Scope

__all__ = ["ACCESS_LOGGER", "configure_access_log", "log_exchange", "note_model"]

ACCESS_LOGGER = "werk.access"
log = logging.getLogger(ACCESS_LOGGER)
_MODEL_KEY = "werk_model"
_MAX_MODEL = 128


def configure_access_log(enabled: bool) -> None:
    """Write one line per request to stderr (``enabled``) or none (``werk serve --quiet``)."""
    log.propagate = False
    log.handlers.clear()
    if not enabled:
        log.setLevel(logging.CRITICAL + 1)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("werk: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def note_model(request: Request, model: object) -> None:
    """Record the model a request named, for its access-log line (a non-string is ignored)."""
    if isinstance(model, str):
        request.scope[_MODEL_KEY] = model


def log_exchange(scope: Scope, status: int, seconds: float, request_id: str) -> None:
    """Log one finished exchange (a no-op unless the access log is on)."""
    if not log.isEnabledFor(logging.INFO):
        return
    model = scope.get(_MODEL_KEY)
    shown = _printable(model[:_MAX_MODEL]) if isinstance(model, str) and model else "-"
    client = scope.get("client")
    address = client[0] if client else "-"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log.info(
        "%s %d %s %s model=%s %.1fms %s %s",
        stamp,
        status,
        scope.get("method", "-"),
        _printable(scope.get("path", "-")),
        shown,
        seconds * 1000.0,
        address,
        request_id,
    )


def _printable(text: str) -> str:
    """``text`` with control characters and spaces escaped: one log line stays one line."""
    if text.isprintable() and " " not in text:
        return text
    return "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in text)
