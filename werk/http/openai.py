"""OpenAI-compatible ``/v1`` routes, delegated to the model's backend.

Errors use the OpenAI error shape (see :mod:`werk.http.errors`). Streaming replies are relayed
as Server-Sent Events as the backend produces them, ending with ``data: [DONE]``; an error after
the stream started is sent as a final ``data: {"error": …}`` event (the status line is gone).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..control.interface import WerkControl
from ..protocol import encode
from ..protocol.media import ImageGenerationRequest
from .auth import Authenticator
from .errors import error_response, to_werk_error
from .guard import admit
from .requests import read_object, read_struct

__all__ = ["openai_routes"]

OPENAI_BODY = 32 * 1024 * 1024
IMAGE_REQUEST_BODY = 64 * 1024


async def _aclose(stream: AsyncIterator[bytes]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with anyio.CancelScope(shield=True):
            await aclose()


class ClosingStreamingResponse(StreamingResponse):
    """A streamed reply that always closes the backend's iterator when the exchange ends:
    completed, failed, or abandoned by the client (even before the first chunk was read)."""

    def __init__(self, source: AsyncIterator[bytes], request_id: str) -> None:
        self._source = source
        super().__init__(
            _sse(source, request_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _aclose(self._source)


def _sse(stream: AsyncIterator[bytes], request_id: str) -> AsyncIterator[bytes]:
    async def relay() -> AsyncIterator[bytes]:
        try:
            async for payload in stream:
                yield b"data: " + payload + b"\n\n"
        except Exception as exc:
            err = to_werk_error(exc, request_id)
            body = {
                "error": {
                    "message": err.message,
                    "type": "server_error",
                    "code": err.code.value,
                    "param": None,
                }
            }
            yield b"data: " + encode(body) + b"\n\n"
        finally:
            await _aclose(stream)
        yield b"data: [DONE]\n\n"

    return relay()


def _completion_route(
    route: Literal["chat.completions", "completions"], control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            body = await read_object(request, OPENAI_BODY)
            reply = await control.openai_request(principal, route, body)
            if reply.stream is not None:
                request_id = request.scope.get("werk_request_id", "req_unknown")
                return ClosingStreamingResponse(reply.stream, request_id)
            return Response(encode(reply.body), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


def _images_route(
    control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/images/generations``: validated here (every bound), then to the backend."""

    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth)
            parsed = await read_struct(request, ImageGenerationRequest, IMAGE_REQUEST_BODY)
            parsed.validate()
            body: dict[str, Any] = msgspec.to_builtins(parsed)
            reply = await control.openai_request(principal, "images.generations", body)
            return Response(encode(reply.body), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


def _models_route(
    control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            admit(request, auth)
            listing: dict[str, Any] = await control.openai_models()
            return Response(encode(listing), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


def openai_routes(control: WerkControl, auth: Authenticator) -> list[Route]:
    return [
        Route("/v1/models", _models_route(control, auth), methods=["GET"]),
        Route(
            "/v1/chat/completions",
            _completion_route("chat.completions", control, auth),
            methods=["POST"],
        ),
        Route("/v1/completions", _completion_route("completions", control, auth), methods=["POST"]),
        Route("/v1/images/generations", _images_route(control, auth), methods=["POST"]),
    ]
