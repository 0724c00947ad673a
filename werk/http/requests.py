"""Request plumbing: request ids, bounded body reading, content type, typed decoding."""

from __future__ import annotations

import secrets
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..protocol import PayloadTooLarge, UnsupportedMediaType, decode

__all__ = ["RequestIdMiddleware", "read_body", "read_struct"]

_T = TypeVar("_T")

REQUEST_ID_HEADER = b"x-werk-request-id"


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


class RequestIdMiddleware:
    """Give every HTTP exchange a fresh ``X-Werk-Request-Id``; client-supplied values are
    ignored (and removed from the response)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope["werk_request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                headers.append((REQUEST_ID_HEADER, request_id.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_id)


def _require_json(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType("request bodies must be application/json")


async def read_body(request: Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes, refusing larger bodies before parsing anything.

    A declared ``Content-Length`` over the bound is refused without reading; a body that
    exceeds the bound while streaming (chunked, or a false length) is refused as soon as the
    bound is crossed, so memory stays bounded.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body over {limit} bytes")
    _require_json(request)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_struct(request: Request, type: type[_T], limit: int) -> _T:
    """Read a bounded JSON body and decode it into ``type`` (unknown fields rejected)."""
    return decode(await read_body(request, limit), type)


async def read_object(request: Request, limit: int) -> dict[str, Any]:
    """Read a bounded JSON body that must be an object (for ``/v1`` pass-through bodies)."""
    return decode(await read_body(request, limit), dict[str, Any])
