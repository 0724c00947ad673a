"""The access log: one line per HTTP exchange, written when its last byte was sent.

``werk serve`` logs every request at the default level (``--quiet`` turns it off), as Ollama
and llama-server do::

    werk: 2026-12-05T16:30:01Z 200 POST /v1/chat/completions model=demo 12.3ms 127.0.0.1 req_…

Fields: UTC time, status, method, path (no query string: it may carry a cursor), the model the
request named (``-`` when it named none), the duration until the last body byte (a stream's
whole length), the client's address and the request id (``X-Werk-Request-Id``). Never a body,
a header or a key. Routes record the model with :func:`note_model`.

Each line is one write to stderr, not a :mod:`logging` record: the record, its formatter and
its handler's lock were about a tenth of ``werk serve``'s CPU time for a short relayed chat
(``py-spy record --gil``, against an upstream that answers at once).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from starlette.requests import Request
from starlette.types import Scope

__all__ = ["configure_access_log", "log_exchange", "note_model"]

_MODEL_KEY = "werk_model"
_MAX_MODEL = 128


class _AccessLog:
    """Where the lines go (``None``: nowhere) and the current second's time stamp."""

    stream: TextIO | None = None
    second = -1
    stamp = ""


def configure_access_log(enabled: bool) -> None:
    """Write one line per request to stderr (``enabled``) or none (``werk serve --quiet``)."""
    _AccessLog.stream = sys.stderr if enabled else None


def note_model(request: Request, model: object) -> None:
    """Record the model a request named, for its access-log line (a non-string is ignored)."""
    if isinstance(model, str):
        request.scope[_MODEL_KEY] = model


def log_exchange(scope: Scope, status: int, seconds: float, request_id: str) -> None:
    """Log one finished exchange (a no-op unless the access log is on)."""
    stream = _AccessLog.stream
    if stream is None:
        return
    model = scope.get(_MODEL_KEY)
    shown = _printable(model[:_MAX_MODEL]) if isinstance(model, str) and model else "-"
    client = scope.get("client")
    address = client[0] if client else "-"
    now = int(time.time())
    if now != _AccessLog.second:
        _AccessLog.second = now
        _AccessLog.stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    method, path = scope.get("method", "-"), _printable(scope.get("path", "-"))
    line = (
        f"werk: {_AccessLog.stamp} {status} {method} {path} model={shown} "
        f"{seconds * 1000.0:.1f}ms {address} {request_id}\n"
    )
    try:
        stream.write(line)
        stream.flush()
    except (OSError, ValueError):  # stderr closed or gone (a detached daemon): not the client's
        pass


def _printable(text: str) -> str:
    """``text`` with control characters and spaces escaped: one log line stays one line."""
    if text.isprintable() and " " not in text:
        return text
    return "".join(c if c.isprintable() and c != " " else f"\\x{ord(c):02x}" for c in text)
