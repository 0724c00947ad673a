"""Request plumbing: request ids, bounded body reading, content type, typed decoding."""

from __future__ import annotations

import contextvars
import logging
import secrets
from typing import Any, TypeVar

import msgspec
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message

from ..protocol import InvalidRequest, PayloadTooLarge, UnsupportedMediaType, decode
from .access import note_model
from .headers import header

__all__ = [
    "RequestIdFilter",
    "current_request_id",
    "read_body",
    "read_struct",
    "set_request_id",
]

_T = TypeVar("_T")

REQUEST_ID_HEADER = b"x-werk-request-id"


_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "werk_request_id", default=None
)


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def current_request_id() -> str | None:
    """The id of the HTTP request being served in this context (tasks and worker threads
    started for it inherit it), or ``None`` outside a request."""
    return _REQUEST_ID.get()


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (``-`` outside a request) on every record a handler emits, so
    every log line of a failed request, the plugin's included, carries the request's id."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _REQUEST_ID.get() or "-"
        return True


def set_request_id(request_id: str) -> None:
    """Make ``request_id`` the current request's id in this context (the exchange middleware
    calls it once per HTTP exchange)."""
    _REQUEST_ID.set(request_id)


def _require_json(request: Request) -> None:
    content_type = header(request, b"content-type") or ""
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType("request bodies must be application/json")


async def read_body(request: Request, limit: int, *, json_only: bool = True) -> bytes:
    """Read at most ``limit`` bytes, refusing larger bodies before parsing anything.

    A declared ``Content-Length`` over the bound is refused without reading; a body that
    exceeds the bound while streaming (chunked, or a false length) is refused as soon as the
    bound is crossed, so memory stays bounded. ``json_only=False``: any ``Content-Type`` (the
    routes of ComfyUI's API, whose clients post JSON without one); it must still parse as JSON.
    """
    _refuse_declared_over(request, limit)  # before the content type: a 413 wins over a 415
    if json_only:
        _require_json(request)
    return await _read_bounded(request, limit)


def _refuse_declared_over(request: Request, limit: int) -> None:
    declared = header(request, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes")


async def _read_bounded(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it crosses ``limit`` (callers checked the declared length
    first)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        # Gone mid-body (or its framing broke); nobody reads the answer, but it is not a fault.
        raise InvalidRequest(
            "the client disconnected before the request body was complete"
        ) from None
    return b"".join(chunks)


_EXACT_FLOAT_INTS = 2**53


def _whole_floats_as_ints(value: Any) -> Any:
    """``2.0`` → ``2`` throughout a decoded JSON value (floats that spell an integer exactly)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_FLOAT_INTS:
        return int(value)
    if isinstance(value, list):
        return [_whole_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: _whole_floats_as_ints(item) for key, item in value.items()}
    return value


def decode_body(body: bytes, type: type[_T]) -> _T:
    """Decode a JSON body into ``type`` (unknown fields rejected).

    JSON has one number type: ``64.0`` *is* the integer 64, and the OpenAPI 3.1 document says
    so (JSON Schema counts whole floats as integers). msgspec's strict decoding refuses a float
    for an ``int`` field, so a body refused for exactly that is decoded once more with its
    whole floats written as integers. Fractions, strings and booleans are still refused.
    """
    try:
        return decode(body, type)
    except InvalidRequest as exc:
        if "got `float`" not in exc.message:
            raise
        try:
            value = _whole_floats_as_ints(msgspec.json.decode(body))
        except (msgspec.DecodeError, RecursionError):
            raise exc from None
        return decode(msgspec.json.encode(value), type)


async def read_struct(request: Request, type: type[_T], limit: int) -> _T:
    """Read a bounded JSON body and decode it into ``type`` (see :func:`decode_body`); a
    ``model`` member is noted for the access log."""
    parsed = decode_body(await read_body(request, limit), type)
    note_model(request, getattr(parsed, "model", None))
    return parsed


async def read_object(request: Request, limit: int) -> dict[str, Any]:
    """Read a bounded JSON body that must be an object (for ``/v1`` pass-through bodies); its
    ``model`` is noted for the access log."""
    body = decode(await read_body(request, limit), dict[str, Any])
    note_model(request, body.get("model"))
    return body


async def read_form(request: Request, limit: int, *, max_files: int = 1) -> FormData:
    """A bounded ``multipart/form-data`` body (``max_files`` files at most), parsed after it
    was read whole, so a huge upload is refused before any parsing."""
    media = (header(request, b"content-type") or "").split(";", 1)[0].strip().lower()
    if media != "multipart/form-data":
        raise UnsupportedMediaType("this route takes multipart/form-data (a file upload)")
    _refuse_declared_over(request, limit)
    body = await _read_bounded(request, limit)
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    try:
        form = await Request(request.scope, replay).form(max_files=max_files, max_fields=16)
    except (MultiPartException, ValueError, KeyError) as exc:
        raise InvalidRequest(f"the multipart form is malformed: {exc}") from None
    note_model(request, form.get("model"))
    return form
