"""TEST CODE: OpenAI-shaped ``/v1`` answers of the ``testkv`` backend.

``chat.completions`` renders ``messages`` with the testkv chat template; ``completions`` takes a
string ``prompt`` (or a one-string list). Generation is the same deterministic decoder as
``werk_decode`` (:mod:`.decoder`), so a ``/v1`` answer equals a Werk prefill + decode of the same
text with the same ``max_tokens`` (``max_completion_tokens`` wins; default 64) and ``stop``.

Non-streaming replies are one complete object (``chat.completion`` / ``text_completion``) with
``id``, ``object``, ``created``, ``model``, ``system_fingerprint`` (the runtime generation),
``choices`` and ``usage``. Streaming replies are an async iterator of JSON payloads (bytes,
without ``data: `` and without ``[DONE]``; the host frames them): an opening chunk (the
assistant role for chat, empty text for completions), one chunk per word, a closing chunk with
``finish_reason`` and, when ``stream_options.include_usage`` is true, a last chunk with empty
``choices`` and the ``usage``. The runtime's liveness is checked before every chunk, so a killed
runtime fails the stream midway with :class:`werk.Unavailable`.

Requests this backend cannot honour (``n`` other than 1, token-array prompts, non-text message
parts, wrong types) raise :class:`werk.InvalidRequest`.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio

from werk import InvalidRequest

from .decoder import Generation
from .kvstate import render_messages

__all__ = ["OpenAIRequest", "completion_body", "parse_request", "split_words", "stream_chunks"]

Route = Literal["chat.completions", "completions"]
DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True, kw_only=True)
class OpenAIRequest:
    """The parts of an OpenAI request body testkv uses."""

    route: Route
    model: str
    text: str
    max_tokens: int
    stop: tuple[str, ...]
    include_usage: bool


def _message_content(content: object) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise InvalidRequest("testkv accepts only text message content")
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest("a text content part needs a string 'text'")
            parts.append(text)
        return "".join(parts)
    raise InvalidRequest("message content must be a string or a list of text parts")


def _prompt_text(route: Route, body: dict[str, Any]) -> str:
    if route == "chat.completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("'messages' must be a non-empty list")
        pairs: list[tuple[str, str]] = []
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise InvalidRequest("each message needs a string 'role'")
            pairs.append((message["role"], _message_content(message.get("content"))))
        return render_messages(pairs)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("'prompt' must be a string")
    return prompt


def _int_field(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(f"'{name}' must be a non-negative integer")
    return value


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop)
    raise InvalidRequest("'stop' must be a string or a list of strings")


def parse_request(route: Route, body: dict[str, Any], default_model: str) -> OpenAIRequest:
    """Validate the fields testkv reads.

    :raises werk.InvalidRequest: a field has a shape testkv cannot honour.
    """
    n = _int_field(body, "n")
    if n is not None and n != 1:
        raise InvalidRequest("testkv generates exactly one choice ('n' must be 1)")
    max_tokens = _int_field(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object")
    include_usage = bool(options and options.get("include_usage") is True)
    model = body.get("model")
    return OpenAIRequest(
        route=route,
        model=model if isinstance(model, str) and model else default_model,
        text=_prompt_text(route, body),
        max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        stop=_stop(body),
        include_usage=include_usage,
    )


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _new_id(route: Route) -> str:
    prefix = "chatcmpl" if route == "chat.completions" else "cmpl"
    return f"{prefix}-testkv-{secrets.token_hex(12)}"


def completion_body(
    request: OpenAIRequest, generation: Generation, *, prompt_tokens: int, fingerprint: str
) -> dict[str, Any]:
    """The complete non-streaming response object."""
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": generation.finish_reason.value,
        "logprobs": None,
    }
    if request.route == "chat.completions":
        choice["message"] = {"role": "assistant", "content": generation.text}
        obj = "chat.completion"
    else:
        choice["text"] = generation.text
        obj = "text_completion"
    return {
        "id": _new_id(request.route),
        "object": obj,
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": fingerprint,
        "choices": [choice],
        "usage": _usage(prompt_tokens, generation.completion_tokens),
    }


_WORD = re.compile(r"\s*\S+|\s+$")
_MAX_PIECE = 64 * 1024


def split_words(text: str) -> list[str]:
    """Stream pieces: each word with its leading whitespace; text over 64 KiB in 64 KiB slices.

    ``"".join(split_words(text)) == text`` for every ``text``.
    """
    if len(text) > _MAX_PIECE:
        return [text[i : i + _MAX_PIECE] for i in range(0, len(text), _MAX_PIECE)]
    return _WORD.findall(text)


async def stream_chunks(
    request: OpenAIRequest,
    *,
    prompt_tokens: int,
    fingerprint: str,
    complete: Callable[[], Generation],
    check_alive: Callable[[], object],
) -> AsyncIterator[bytes]:
    """The streaming reply (see the module docstring).

    :param complete: runs the decoder; called after the opening chunk, so a decode failure
        surfaces mid-stream.
    :param check_alive: raises :class:`werk.Unavailable` when the runtime died; called before
        every chunk.
    """
    chat = request.route == "chat.completions"
    base: dict[str, Any] = {
        "id": _new_id(request.route),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "system_fingerprint": fingerprint,
    }

    def chunk(piece: str | None, finish: str | None, role: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            delta: dict[str, str] = {}
            if role:
                delta["role"] = "assistant"
            if piece is not None:
                delta["content"] = piece
            choice["delta"] = delta
        else:
            choice["text"] = piece or ""
        payload = {**base, "choices": [choice]}
        if request.include_usage:
            payload["usage"] = None
        return json.dumps(payload, separators=(",", ":")).encode("utf-8")

    check_alive()
    yield chunk("", None, role=True)
    generation = complete()
    for piece in split_words(generation.text):
        await anyio.sleep(0)
        check_alive()
        yield chunk(piece, None)
    await anyio.sleep(0)
    check_alive()
    yield chunk(None, generation.finish_reason.value)
    if request.include_usage:
        usage = _usage(prompt_tokens, generation.completion_tokens)
        last = {**base, "choices": [], "usage": usage}
        yield json.dumps(last, separators=(",", ":")).encode("utf-8")
