"""A persisted ``/v1`` chat turn (``"werk": {"persist": true}``) streamed as its reply is made.

With ``"stream": true`` the turn (:mod:`werk.control.chat_states`) runs while the response is
open. Nothing is sent before the reply's first text or the turn's end, so a turn that fails
before it (an unknown model, a refused prefill) answers with its error status as usual. Then
come OpenAI's chunks: the role, one chunk per piece of text as the backend generates it (all of
it at once from a backend that does not stream its decode), and, once the conversation's state
is kept, the finish reason with ``usage`` and the ``werk`` member, then ``[DONE]``. An error
after the first piece is a last ``data: {"error": …}`` event. A client that leaves (during the
prefill too) cancels the turn: its decode stops and nothing of it is kept.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from ..protocol import encode
from .errors import error_response, to_werk_error

__all__ = ["PersistedTurnStream"]

Turn = Callable[[Callable[[str], Awaitable[None]]], Awaitable[dict[str, Any]]]
"""Runs the turn, awaiting its argument with each piece of text; returns the answer."""

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + encode(data) + b"\n\n"


class PersistedTurnStream(Response):
    """The streamed answer of one persisted turn; see the module docstring."""

    def __init__(self, request: Request, model: str, turn: Turn) -> None:
        super().__init__()
        self._request = request
        self._turn = turn
        self._base = {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def _chunk(self, delta: dict[str, Any], **extra: Any) -> bytes:
        return _event({**self._base, "choices": [{"index": 0, "delta": delta, **extra}]})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender, events = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)

        async def on_text(piece: str) -> None:
            sender.send_nowait(("text", piece))

        async def run() -> None:
            try:
                sender.send_nowait(("answer", await self._turn(on_text)))
            except Exception as exc:
                sender.send_nowait(("error", exc))

        finished = False
        async with anyio.create_task_group() as group:

            async def until_disconnect() -> None:
                while True:
                    message: Message = await receive()
                    if message["type"] == "http.disconnect":
                        break
                if not finished:  # the client left: the turn ends here
                    group.cancel_scope.cancel()

            group.start_soon(run)
            group.start_soon(until_disconnect)
            kind, value = await events.receive()
            if kind == "error":
                finished = True
                await error_response(self._request, value)(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
            body = self._chunk({"role": "assistant", "content": ""})
            while kind == "text":
                body += self._chunk({"content": value})
                try:  # pieces already here leave together
                    kind, value = events.receive_nowait()
                    continue
                except anyio.WouldBlock:
                    pass
                await send({"type": "http.response.body", "body": body, "more_body": True})
                kind, value = await events.receive()
                body = b""
            body += self._ending(kind, value)
            finished = True
            await send({"type": "http.response.body", "body": body, "more_body": False})

    def _ending(self, kind: str, value: Any) -> bytes:
        if kind == "error":
            err = to_werk_error(value, self._request.scope.get("werk_request_id", "req_unknown"))
            error = {
                "message": err.message,
                "type": "server_error",
                "code": err.openai_code or err.code.value,
                "param": err.param,
            }
            return _event({"error": error}) + b"data: [DONE]\n\n"
        (choice,) = value["choices"]
        final = {
            **self._base,
            "system_fingerprint": value["system_fingerprint"],
            "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}],
            "usage": value["usage"],
            "werk": value["werk"],
        }
        return _event(final) + b"data: [DONE]\n\n"
