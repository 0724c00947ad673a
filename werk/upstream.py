"""Relaying an OpenAI-compatible request to a backend's own HTTP server (vLLM, oMLX, …).

:func:`openai_upstream` sends one ``/v1`` request with an ``httpx.AsyncClient`` the plugin owns
(base URL and credentials of its child) and returns a :class:`werk.OpenAIReply`: the JSON
object, or a stream of SSE ``data`` payloads read incrementally (:class:`UpstreamSSE`). The
backend's error bodies never reach the client: statuses map to Werk errors with Werk's own
words (the body is only logged). The stream is closed by ``aclose()``, which the host always
calls (backend contract 1.1); closing an unfinished stream closes the upstream response, which
makes the backend cancel the generation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import msgspec

from .backends import OpenAIReply
from .protocol import (
    BackendError,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
    Unavailable,
    WerkError,
    WerkTimeout,
)

__all__ = [
    "MAX_EVENT_BYTES",
    "RewrittenStream",
    "UpstreamSSE",
    "map_upstream_status",
    "openai_upstream",
    "renamed",
]

log = logging.getLogger("werk.upstream")

MAX_EVENT_BYTES = 16 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024


def map_upstream_status(status: int, what: str) -> WerkError:
    """Werk's own error for a backend's error status (``what`` names the backend)."""
    if status == 400 or status == 422:
        return InvalidRequest(f"{what} rejected the request as invalid; check its fields")
    if status == 404:
        return NotFound(f"{what} does not know the requested model or route")
    if status == 413:
        return InvalidRequest(f"{what} refused the request as too large")
    if status == 429:
        return ResourceExhausted(f"{what} is at capacity; retry later")
    if status == 503:
        return Unavailable(f"{what} is not ready", retryable=True)
    return BackendError(f"{what} failed with HTTP {status}")


def _transport_error(exc: httpx.HTTPError, what: str) -> WerkError:
    if isinstance(exc, httpx.TimeoutException):
        return WerkTimeout(f"{what} did not answer in time")
    return Unavailable(f"{what} could not be reached", retryable=True)


class UpstreamSSE:
    """An upstream SSE response as bare ``data`` payloads (``[DONE]`` ends it)."""

    def __init__(self, response: httpx.Response, what: str) -> None:
        self._response = response
        self._what = what
        self._chunks: AsyncIterator[bytes] = response.aiter_bytes()
        self._buffer = b""
        self._data: list[bytes] = []
        self._ready: list[bytes] = []
        self._done = False

    def __aiter__(self) -> UpstreamSSE:
        return self

    async def __anext__(self) -> bytes:
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            await self._fill()
        return self._ready.pop(0)

    async def _fill(self) -> None:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._line(self._buffer)
            self._line(b"")
            if not self._done:  # no [DONE]: the backend went away mid-reply
                self._done = True
                raise BackendError(f"{self._what} ended its stream before finishing") from None
            return
        except httpx.HTTPError as exc:
            self._done = True
            if isinstance(exc, httpx.TimeoutException):
                raise WerkTimeout(f"{self._what} stopped sending its stream") from None
            # The reply had started: the backend went away mid-stream, it was reachable.
            raise BackendError(f"{self._what} broke off its stream before finishing") from None
        self._buffer += chunk
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise BackendError(f"{self._what} sent an oversized stream event")
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            return  # comments, event:, id:, retry: carry nothing Werk relays
        if not self._data:
            return
        payload, self._data = b"\n".join(self._data), []
        if payload == b"[DONE]":
            self._done = True
            return
        if payload.startswith(b'{"error"'):
            log.warning("%s stream error: %s", self._what, payload[:MAX_ERROR_BYTES].decode())
            raise BackendError(f"{self._what} failed while streaming its reply")
        self._ready.append(payload)

    async def aclose(self) -> None:
        self._done = True
        await self._response.aclose()


class RewrittenStream:
    """A relayed stream whose JSON chunks pass through ``rewrite`` (e.g. to name Werk's model
    id instead of the backend's, or to normalise ``usage``); other payloads pass unchanged.

    ``rewrite`` gets each decoded JSON object and returns the object to send. ``aclose()``
    closes the upstream (the host always calls it when the exchange ends)."""

    def __init__(
        self, upstream: AsyncIterator[bytes], rewrite: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        self._upstream = upstream
        self._rewrite = rewrite

    def __aiter__(self) -> RewrittenStream:
        return self

    async def __anext__(self) -> bytes:
        payload = await self._upstream.__anext__()
        try:
            chunk = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            return payload
        if not isinstance(chunk, dict):
            return payload
        return msgspec.json.encode(self._rewrite(chunk))

    async def aclose(self) -> None:
        aclose = getattr(self._upstream, "aclose", None)
        if aclose is not None:
            await aclose()


def renamed(model_id: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A :class:`RewrittenStream` rewrite that names ``model_id`` where a chunk names a model."""

    def rewrite(chunk: dict[str, Any]) -> dict[str, Any]:
        if "model" in chunk:
            chunk["model"] = model_id
        return chunk

    return rewrite


async def openai_upstream(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], *, stream: bool, what: str
) -> OpenAIReply:
    """POST ``body`` to ``path`` of the backend behind ``http``; see the module docstring.

    :param what: how error messages name the backend (``vLLM``).
    """
    try:
        request = http.build_request("POST", path, json=body)
        response = await http.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise _transport_error(exc, what) from None
    if response.status_code != 200:
        try:
            detail = (await response.aread())[:MAX_ERROR_BYTES]
        except httpx.HTTPError:
            detail = b""
        finally:
            await response.aclose()
        log.warning(
            "%s answered HTTP %s: %s", what, response.status_code, detail.decode(errors="replace")
        )
        raise map_upstream_status(response.status_code, what)
    if stream:
        return OpenAIReply(stream=UpstreamSSE(response, what))
    try:
        raw = await response.aread()
    except httpx.HTTPError as exc:
        raise _transport_error(exc, what) from None
    finally:
        await response.aclose()
    if len(raw) > MAX_BODY_BYTES:
        raise BackendError(f"{what} sent an oversized reply")
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        data = None
    if not isinstance(data, dict):
        raise BackendError(f"{what} answered with something that is not a JSON object")
    return OpenAIReply(body=data)
