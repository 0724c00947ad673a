"""OpenAI replies for a backend that generates text itself: a whole body, or SSE chunks as the
generator's text deltas arrive.

The generator (a companion worker's streamed ``execute``, a per-request runner) is a
:class:`GenerationEvents`: an async iterator of events ``{"text": DELTA, "ids": [TOKEN, ...]}``
that, once exhausted, holds its ``result``: ``{"finish_reason": "stop"|"length", "usage":
{"prompt_tokens": N, "completion_tokens": M}}`` (and ``"cached_tokens": C`` when the generator
reused C prompt tokens: the reply's ``usage.prompt_tokens_details``), with ``"prompt_ids"`` when
the request asked for ``return_token_ids``, or ``{"refused": TEXT}`` for a request it cannot
serve (a prompt longer than the context: ``400``, the generator stays usable).
:func:`generation_reply` turns one into the :class:`werk.OpenAIReply` for a call.

With ``return_token_ids`` (vLLM's field, 0.10.2 and later) a whole reply carries the choice's
``token_ids`` and the top-level ``prompt_token_ids``; a stream carries each chunk's
``token_ids`` and ``prompt_token_ids`` in the chunk with ``finish_reason`` (the prompt is known
only when the generator ends).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, Protocol, Self

from .backends import OpenAICall, OpenAIReply
from .protocol import InvalidRequest

__all__ = ["GenerationEvents", "generation_reply"]


class GenerationEvents(Protocol):
    """A running generation: its events, then its ``result`` (``None`` until they ended)."""

    result: dict[str, Any] | None

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]: ...


class _Reply:
    """The ids and shapes one reply shares between its chunks."""

    def __init__(self, route: str, model: str, token_ids: bool) -> None:
        self.chat = route == "chat.completions"
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = model
        self.token_ids = token_ids

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(
        self,
        text: str | None,
        finish: str | None,
        ids: list[int],
        *,
        first: bool = False,
        prompt_ids: list[int] | None = None,
    ) -> bytes:
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
        payload = self._envelope(kind) | {"choices": [choice]}
        if self.token_ids:
            choice["token_ids"] = ids
            if prompt_ids is not None:
                payload["prompt_token_ids"] = prompt_ids
        return json.dumps(payload).encode()

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return json.dumps(self._envelope(kind) | {"choices": [], "usage": usage}).encode()

    def body(self, text: str, ids: list[int], result: dict[str, Any]) -> dict[str, Any]:
        finish = str(result.get("finish_reason", "stop"))
        if self.chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "finish_reason": finish}
            kind = "text_completion"
        body = self._envelope(kind) | {"choices": [choice], "usage": _usage(result)}
        if self.token_ids:
            choice["token_ids"] = ids
            if "prompt_ids" in result:  # a generator that cannot tell them leaves them out
                body["prompt_token_ids"] = _ids(result["prompt_ids"])
        return body


def _ids(value: Any) -> list[int]:
    return [int(i) for i in value] if isinstance(value, list) else []


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    usage = result.get("usage") or {}
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    counts: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if "cached_tokens" in usage:  # a generator that reuses a prompt prefix says how much
        counts["prompt_tokens_details"] = {"cached_tokens": int(usage["cached_tokens"])}
    return counts


def _refusal(result: dict[str, Any] | None) -> None:
    if result is not None and "refused" in result:
        raise InvalidRequest(str(result["refused"])[:300])


async def _body(events: GenerationEvents, reply: _Reply) -> dict[str, Any]:
    texts: list[str] = []
    ids: list[int] = []
    async for event in events:
        texts.append(str(event.get("text", "")))
        ids.extend(_ids(event.get("ids")))
    _refusal(events.result)
    return reply.body("".join(texts), ids, events.result or {})


class _Chunks:
    """SSE payloads for a streamed answer; owns the generation until closed.

    The first event was read before the HTTP reply began (so a refusal is an ordinary ``400``).
    ``aclose()`` (the host always calls it, also when the client went away) leaves the
    generation's context, which stops a generation still running.
    """

    def __init__(
        self,
        events: GenerationEvents,
        iterator: AsyncIterator[dict[str, Any]],
        exits: AsyncExitStack,
        reply: _Reply,
        first: dict[str, Any] | None,
        include_usage: bool,
    ) -> None:
        self._events = events
        self._iterator = iterator
        self._exits = exits
        self._reply = reply
        self._include_usage = include_usage
        self._pending = [reply.chunk("", None, [], first=True)]
        if first is not None:
            self._pending.append(self._delta(first))
        self._done = False

    def _delta(self, event: dict[str, Any]) -> bytes:
        return self._reply.chunk(str(event.get("text", "")), None, _ids(event.get("ids")))

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        if self._pending:
            return self._pending.pop(0)
        if self._done:
            await self.aclose()
            raise StopAsyncIteration
        try:
            return self._delta(await anext(self._iterator))
        except StopAsyncIteration:
            pass
        self._done = True
        result = self._events.result or {}
        finish = str(result.get("finish_reason", "stop"))
        prompt_ids = _ids(result["prompt_ids"]) if "prompt_ids" in result else None
        self._pending.append(self._reply.chunk(None, finish, [], prompt_ids=prompt_ids))
        if self._include_usage:
            self._pending.append(self._reply.usage_chunk(_usage(result)))
        await self.aclose()
        return self._pending.pop(0)

    async def aclose(self) -> None:
        await self._exits.aclose()


async def generation_reply(
    call: OpenAICall,
    model: str,
    generation: AbstractAsyncContextManager[GenerationEvents],
) -> OpenAIReply:
    """The OpenAI reply for ``call`` from a generation (entered here; left when the reply is
    complete, or — streamed — when the host closes the stream).

    :param model: the model id the reply names.
    :param generation: e.g. ``worker.streaming("execute", args)`` (:class:`werk.CompanionWorker`).
    :raises werk.InvalidRequest: the generator refused the request (it stays usable).
    """
    reply = _Reply(call.route, model, bool(call.body.get("return_token_ids")))
    exits = AsyncExitStack()
    streaming = False
    try:
        events = await exits.enter_async_context(generation)
        if not call.stream:
            return OpenAIReply(body=await _body(events, reply))
        iterator = aiter(events)
        first = await anext(iterator, None)  # a refusal is a 400, before the reply starts
        if first is None:
            _refusal(events.result)
        usage = bool((call.body.get("stream_options") or {}).get("include_usage"))
        chunks = _Chunks(events, iterator, exits, reply, first, usage)
        streaming = True  # the chunks own the generation now; the host closes them
        return OpenAIReply(stream=chunks)
    finally:
        if not streaming:
            await exits.aclose()
