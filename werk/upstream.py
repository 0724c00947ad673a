"""Relaying an OpenAI-compatible request to a backend's own HTTP server: the one ``/v1`` relay.

Every plugin whose backend speaks ``/v1`` itself (llama-server, vLLM, oMLX, …) answers
``werk_openai`` with :func:`openai_upstream`. It sends one request through the plugin's
:class:`werk.LoopbackClient` (pooled keep-alive HTTP/1.1 connections to that server) and returns
a :class:`werk.OpenAIReply`: the JSON object, or a stream of SSE ``data`` payloads read
incrementally (:class:`UpstreamSSE`).

What every backend gets from it:

* **One retry, only when it is safe.** A request that failed before any response byte
  (:class:`werk.NotSent`: a pooled connection the server had closed, a reset) is sent once more
  on a new connection; a failure after the first response byte never is.
* **Connections are reused.** A stream that reached ``[DONE]`` reads the (tiny) rest of its body
  before it is closed, so its connection returns to the pool; a stream the client abandoned is
  closed instead, which makes the backend cancel the generation.
* **Payloads pass through unchanged** unless something must change: with ``model`` set, a chunk
  or body that names a model names Werk's id instead (decoded and re-encoded only then); any
  other change is a ``rewrite`` (:class:`RewrittenStream`, :func:`renamed`).
* **One error map.** A non-200 status, a transport failure, an ``{"error": …}`` event mid-stream
  and a stream cut before ``[DONE]`` become Werk errors in Werk's words
  (:func:`map_upstream_status`); the backend's text goes only to the log. What is truly
  backend-specific (llama.cpp's context-size answer, "the child process exited") is an
  :class:`UpstreamErrors` hook consulted first.
* **Exactly-once close.** ``on_close`` runs once when the exchange ends: a non-streamed reply
  read, any failure, or the stream's ``aclose()`` (which the host always calls, backend contract
  1.1). Plugins release what they hold for the request there (a slot lease).
"""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import msgspec

from .backends import OpenAIReply
from .loopback import (
    LoopbackClient,
    LoopbackError,
    LoopbackResponse,
    LoopbackTimeout,
    NotSent,
    ResponseTooLarge,
)
from .protocol import (
    BackendError,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Unsupported,
    WerkError,
    WerkTimeout,
)
from .sse import EventTooLarge, SSEDecoder

__all__ = [
    "MAX_EVENT_BYTES",
    "RewrittenStream",
    "UpstreamErrors",
    "UpstreamSSE",
    "map_upstream_status",
    "openai_upstream",
    "renamed",
]

log = logging.getLogger("werk.upstream")

MAX_EVENT_BYTES = 16 * 1024 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
DRAIN_SECONDS = 1.0

StatusHook = Callable[[int, dict[str, Any]], WerkError | None]
TransportHook = Callable[[LoopbackError], WerkError | None]


class UpstreamErrors(msgspec.Struct, frozen=True, kw_only=True):
    """Backend-specific readings of a failure, asked before the host's own map.

    :ivar status: ``status(http_status, error) -> WerkError | None`` for an error status or an
        ``{"error": …}`` stream event: ``error`` is the decoded ``error`` object of the body
        (``{}`` when there is none). ``None`` falls through to :func:`map_upstream_status`.
        Build the message from numbers and known words, never from the backend's text.
    :ivar transport: ``transport(exc) -> WerkError | None`` for a failed exchange (``exc`` is
        the :class:`werk.LoopbackError`), e.g. to say that the child process exited.
    """

    status: StatusHook | None = None
    transport: TransportHook | None = None


_NO_HOOKS = UpstreamErrors()


MAX_REASON_CHARS = 500
"""The most of a backend's own error message a client gets."""

_PATH = re.compile(r"(?<![\w.])/(?:[\w.@+-]+/)+[\w.@+-]*")
_SECRET = re.compile(
    r"(?i)\b(?:bearer\s+)?(?=[A-Za-z0-9_-]*[0-9])(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{32,}\b"
)  # a long run of letters and digits, both: an API key, a token, a hash
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_CONTEXT_OVERFLOW = re.compile(r"(?i)maximum context length|context length exceeded")


def backend_reason(error: dict[str, Any]) -> str | None:
    """The backend's own message, fit for a client: control characters become spaces, file
    paths and anything key-like are replaced, at most :data:`MAX_REASON_CHARS` characters."""
    message = error.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    text = _CONTROL.sub(" ", message).strip()
    text = _PATH.sub("<path>", text)
    text = _SECRET.sub("<redacted>", text)
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return text


def map_upstream_status(status: int, what: str, error: dict[str, Any] | None = None) -> WerkError:
    """Werk's error for a backend's error status (``what`` names the backend), with the
    backend's own reason (:func:`backend_reason`) and, on ``/v1``, OpenAI's ``code`` for a
    context overflow (``context_length_exceeded``) and the backend's ``param``."""
    error = error or {}
    reason = backend_reason(error)
    raw_param = error.get("param")
    param = raw_param if isinstance(raw_param, str) and len(raw_param) <= 64 else None
    if status in (400, 413, 422) and reason is not None and _CONTEXT_OVERFLOW.search(reason):
        return InvalidRequest(
            f"{what}: {reason}",
            param=param or "messages",
            openai_code="context_length_exceeded",
        )
    if status in (400, 422):
        if reason is not None:
            return InvalidRequest(f"{what} rejected the request: {reason}", param=param)
        return InvalidRequest(f"{what} rejected the request as invalid; check its fields")
    if status == 404:
        return NotFound(f"{what} does not know the requested model or route")
    if status == 413:
        return InvalidRequest(f"{what} refused the request as too large")
    if status == 429:
        return ResourceExhausted(f"{what} is at capacity; retry later")
    if status == 501:
        return Unsupported(f"{what} does not support this request for this model")
    if status == 503:
        return Unavailable(f"{what} is not ready", retryable=True)
    return BackendError(f"{what} failed with HTTP {status}")


def _error_object(raw: bytes) -> dict[str, Any]:
    try:
        decoded = msgspec.json.decode(raw[:MAX_ERROR_BYTES])
    except msgspec.DecodeError:
        return {}
    if not isinstance(decoded, dict):
        return {}
    error = decoded.get("error")
    if isinstance(error, dict):
        return error
    return decoded if isinstance(decoded.get("message"), str) else {}  # {"object": "error", …}


class _Exchange:
    """What one relayed request needs on every path: names, hooks, and the once-only close."""

    __slots__ = ("errors", "logger", "model", "on_close", "what")

    def __init__(
        self,
        what: str,
        errors: UpstreamErrors,
        logger: logging.Logger,
        model: str | None,
        on_close: Callable[[], None] | None,
    ) -> None:
        self.what = what
        self.errors = errors
        self.logger = logger
        self.model = model
        self.on_close = on_close

    def close(self) -> None:
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()

    def status_error(self, status: int, error: dict[str, Any]) -> WerkError:
        hook = self.errors.status
        mapped = hook(status, error) if hook is not None else None
        return mapped if mapped is not None else map_upstream_status(status, self.what, error)

    def transport_error(self, exc: LoopbackError, *, streaming: bool = False) -> WerkError:
        hook = self.errors.transport
        mapped = hook(exc) if hook is not None else None
        if mapped is not None:
            return mapped
        what = self.what
        if isinstance(exc, LoopbackTimeout):
            if streaming:
                return WerkTimeout(f"{what} stopped sending its stream")
            return WerkTimeout(f"{what} did not answer in time")
        if isinstance(exc, ResponseTooLarge):
            return BackendError(f"{what}'s response exceeded Werk's size limit")
        if streaming:  # the reply had started: the backend went away mid-stream
            return BackendError(f"{what} broke off its stream before finishing")
        if isinstance(exc, NotSent):
            return Unavailable(f"{what} could not be reached", retryable=True)
        return BackendError(f"{what} closed the connection without an answer")

    def renamed(self, payload: bytes) -> bytes:
        """``payload`` naming Werk's model id where it names a model (decoded only then)."""
        if self.model is None or b'"model"' not in payload:
            return payload
        try:
            data = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            return payload
        if isinstance(data, dict) and "model" in data:
            data["model"] = self.model
            return msgspec.json.encode(data)
        return payload


async def _send(
    client: LoopbackClient, path: str, content: bytes, exchange: _Exchange
) -> LoopbackResponse:
    try:
        return await client.request("POST", path, body=content)
    except NotSent as exc:
        exchange.logger.debug(
            "%s: the request failed before a response (%s); retrying once", exchange.what, exc
        )
    except LoopbackError as exc:
        raise exchange.transport_error(exc) from None
    try:
        return await client.request("POST", path, body=content, fresh=True)
    except LoopbackError as exc:
        raise exchange.transport_error(exc) from None


async def _aclose(response: LoopbackResponse) -> None:
    try:
        await response.aclose()
    except Exception:
        log.debug("closing an upstream response failed", exc_info=True)


async def openai_upstream(
    client: LoopbackClient,
    path: str,
    body: dict[str, Any] | bytes,
    *,
    stream: bool,
    what: str,
    model: str | None = None,
    errors: UpstreamErrors | None = None,
    on_close: Callable[[], None] | None = None,
    logger: logging.Logger | None = None,
) -> OpenAIReply:
    """POST ``body`` to ``path`` of the server behind ``client``; see the module docstring.

    :param client: the plugin's :class:`werk.LoopbackClient` for its server (one per server,
        created with the server's ``Authorization`` header).
    :param body: the JSON object to send, or its encoding (encoded once by the caller).
    :param stream: whether the client asked for SSE; the reply then carries a stream.
    :param what: how error messages name the backend (``vLLM``, ``llama-server``).
    :param model: Werk's model id, put where the backend's reply names its own model.
    :param errors: backend-specific error readings (:class:`UpstreamErrors`).
    :param on_close: called exactly once when the exchange has ended (see the module docstring).
    :param logger: where the backend's error text and the retry are logged (the plugin's own
        logger; ``werk.upstream`` by default).
    :raises werk.WerkError: the request failed; ``on_close`` has run.
    """
    exchange = _Exchange(what, errors or _NO_HOOKS, logger or log, model, on_close)
    try:
        content = body if isinstance(body, bytes) else msgspec.json.encode(body)
        response = await _send(client, path, content, exchange)
    except BaseException:
        exchange.close()
        raise
    try:
        if response.status != 200:
            raw = await response.read(MAX_ERROR_BYTES * 16)
            exchange.logger.warning(
                "%s answered HTTP %s: %s",
                what,
                response.status,
                raw[:MAX_ERROR_BYTES].decode("utf-8", "replace"),
            )
            raise exchange.status_error(response.status, _error_object(raw))
        if stream:
            if not response.content_type.startswith("text/event-stream"):
                raise BackendError(f"{what} did not stream its reply")
            return OpenAIReply(stream=UpstreamSSE(response, exchange))
        raw = await response.read(MAX_BODY_BYTES)
    except LoopbackError as exc:
        exchange.close()
        await _aclose(response)
        raise exchange.transport_error(exc) from None
    except BaseException:
        exchange.close()
        await _aclose(response)
        raise
    exchange.close()
    await _aclose(response)
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        data = None
    if not isinstance(data, dict):
        raise BackendError(f"{what} answered with something that is not a JSON object")
    if model is not None and "model" in data:
        data["model"] = model
    return OpenAIReply(body=data)


class UpstreamSSE:
    """A backend's SSE reply as bare ``data`` payloads, read incrementally.

    ``[DONE]`` ends it; an ``{"error": …}`` event, a cut connection, or the end of the body
    before ``[DONE]`` is a Werk error. Any end of the iteration (its end, a failure) closes it;
    :meth:`aclose` (always called by the host, also for a stream never iterated) runs the
    exchange's ``on_close``, drains a finished body so its connection is reused, and closes an
    unfinished one, which makes the backend cancel the generation.
    """

    def __init__(self, response: LoopbackResponse, exchange: _Exchange) -> None:
        self._response = response
        self._exchange = exchange
        self._chunks: AsyncIterator[bytes] = aiter(response)
        self._decoder = SSEDecoder(max_event_bytes=MAX_EVENT_BYTES)
        self._ready: collections.deque[bytes] = collections.deque()
        self._failure: WerkError | None = None
        """An error event, raised once the payloads before it were handed out."""
        self._done = False
        self._finished = False
        self._closed = False

    def __aiter__(self) -> UpstreamSSE:
        return self

    async def __anext__(self) -> bytes:
        try:
            while not self._ready:
                if self._failure is not None:
                    failure, self._failure = self._failure, None
                    raise failure
                if self._done:
                    raise StopAsyncIteration
                await self._fill()
            return self._ready.popleft()
        except BaseException:
            await self.aclose()
            raise

    def take_ready(self) -> list[bytes]:
        """The payloads already received and decoded, handed over without waiting (``[]``
        when the next one must be awaited): the host relays them in one write."""
        if not self._ready:
            return []
        ready = list(self._ready)
        self._ready.clear()
        return ready

    async def _fill(self) -> None:
        exchange = self._exchange
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            if self._decoder.end() == [b"[DONE]"]:  # its blank line was all that was missing
                self._done = self._finished = True
            if not self._done:  # no [DONE]: the backend went away mid-reply (an event it cut
                # off is not relayed)
                self._done = True
                self._failure = BackendError(f"{exchange.what} ended its stream before finishing")
            return
        except LoopbackError as exc:
            self._done = True
            raise exchange.transport_error(exc, streaming=True) from None
        try:
            payloads = self._decoder.feed(chunk)
        except EventTooLarge:
            self._done = True
            raise BackendError(f"{exchange.what} sent an oversized stream event") from None
        self._payloads(payloads)

    def _payloads(self, payloads: list[bytes]) -> None:
        for payload in payloads:
            if self._done:
                return
            if payload == b"[DONE]":
                self._done = self._finished = True
                return
            if payload.startswith(b'{"error"'):
                self._done = True
                self._exchange.logger.warning(
                    "%s stream error: %s",
                    self._exchange.what,
                    payload[:MAX_ERROR_BYTES].decode("utf-8", "replace"),
                )
                self._failure = self._stream_error(payload)
                return
            self._ready.append(self._exchange.renamed(payload))

    def _stream_error(self, payload: bytes) -> WerkError:
        error = _error_object(payload)
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
            return self._exchange.status_error(code, error)
        return BackendError(f"{self._exchange.what} failed while streaming its reply")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        finished, self._done = self._finished, True
        self._exchange.close()
        if finished:
            await self._drain()
        await _aclose(self._response)

    async def _drain(self) -> None:
        """After ``[DONE]`` read the rest of the body (the chunked terminator), so that the
        connection can return to the pool; past a small bound it is closed instead."""
        drained = 0
        try:
            with anyio.fail_after(DRAIN_SECONDS):
                async for chunk in self._chunks:
                    drained += len(chunk)
                    if drained > MAX_ERROR_BYTES:
                        return
        except (TimeoutError, LoopbackError):
            return


class RewrittenStream:
    """A relayed stream whose JSON chunks pass through ``rewrite`` (e.g. to normalise
    ``usage``); other payloads pass unchanged.

    ``rewrite`` gets each decoded JSON object and returns the object to send. ``aclose()``
    closes the upstream (the host always calls it when the exchange ends)."""

    def __init__(
        self, upstream: AsyncIterator[bytes], rewrite: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> None:
        self._upstream = upstream
        self._rewrite = rewrite
        self._take: Callable[[], list[bytes]] | None = getattr(upstream, "take_ready", None)

    def __aiter__(self) -> RewrittenStream:
        return self

    async def __anext__(self) -> bytes:
        return self._rewritten(await self._upstream.__anext__())

    def take_ready(self) -> list[bytes]:
        """The upstream's payloads at hand, rewritten (see :meth:`UpstreamSSE.take_ready`)."""
        return [self._rewritten(p) for p in self._take()] if self._take is not None else []

    def _rewritten(self, payload: bytes) -> bytes:
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
    """A :class:`RewrittenStream` rewrite that names ``model_id`` where a chunk names a model
    (for a stream that is rewritten anyway; otherwise pass ``model=`` to
    :func:`openai_upstream`, which decodes only the chunks that name a model)."""

    def rewrite(chunk: dict[str, Any]) -> dict[str, Any]:
        if "model" in chunk:
            chunk["model"] = model_id
        return chunk

    return rewrite
