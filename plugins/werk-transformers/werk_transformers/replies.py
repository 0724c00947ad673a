"""OpenAI reply shapes for what the worker generated: a whole body, or SSE chunks as the
worker's text deltas arrive (:class:`GenerationStream`)."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from typing import Any, Self

from werk import CompanionStream, InvalidRequest

__all__ = ["GenerationStream", "Reply", "body_of"]


class Reply:
    """The ids and shapes one reply shares between its chunks."""

    def __init__(self, route: str, model: str) -> None:
        self.chat = route == "chat.completions"
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        self.id = prefix + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def choice(self, text: str | None, finish: str | None, *, first: bool = False) -> bytes:
        """One SSE chunk with one choice (``text`` ``None``: an empty delta)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish}
            kind = "text_completion"
        return json.dumps(self._envelope(kind) | {"choices": [choice]}).encode()

    def usage_chunk(self, usage: dict[str, int]) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps(self._envelope(kind) | {"choices": [], "usage": usage}).encode()

    def body(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            kind = "text_completion"
        return self._envelope(kind) | {"choices": [choice], "usage": usage}


def _usage(result: dict[str, Any]) -> dict[str, int]:
    usage = result.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def refusal(result: dict[str, Any] | None) -> None:
    """Raise the worker's refusal of a request (it stays warm) as ``InvalidRequest``."""
    if result is not None and "refused" in result:
        raise InvalidRequest(str(result["refused"])[:300])


async def body_of(stream: CompanionStream, reply: Reply) -> dict[str, Any]:
    """The whole answer: every delta, then the worker's result."""
    text = "".join([str(event.get("text", "")) async for event in stream])
    refusal(stream.result)
    result = stream.result or {}
    return reply.body(text, str(result.get("finish_reason", "stop")), _usage(result))


class GenerationStream:
    """SSE payloads for a streamed answer; owns the worker for the request until closed.

    The first event was read before the HTTP reply began (so a refusal is an ordinary ``400``):
    it is passed in as ``first``. ``aclose()`` (the host always calls it, also when the client
    went away) leaves the worker's stream, which cancels a generation still running.
    """

    def __init__(
        self,
        stream: CompanionStream,
        exits: contextlib.AsyncExitStack,
        reply: Reply,
        first: dict[str, Any] | None,
        include_usage: bool,
    ) -> None:
        self._stream = stream
        self._exits = exits
        self._reply = reply
        self._include_usage = include_usage
        self._pending: list[bytes] = [reply.choice("", None, first=True)]
        if first is not None:
            self._pending.append(reply.choice(str(first.get("text", "")), None))
        self._done = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        if self._pending:
            return self._pending.pop(0)
        if self._done:
            await self.aclose()
            raise StopAsyncIteration
        async for event in self._stream:
            return self._reply.choice(str(event.get("text", "")), None)
        self._done = True
        result = self._stream.result or {}
        self._pending.append(self._reply.choice(None, str(result.get("finish_reason", "stop"))))
        if self._include_usage:
            self._pending.append(self._reply.usage_chunk(_usage(result)))
        await self.aclose()
        return self._pending.pop(0)

    async def aclose(self) -> None:
        await self._exits.aclose()
