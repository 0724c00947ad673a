"""``/v1`` chat and text completions, proxied to the managed child.

``chat.completions`` → the child's ``/v1/chat/completions``, ``completions`` →
``/v1/completions``. Werk rewrites three fields of the client's body: ``model`` (the name the
child expects), ``cache_prompt: true`` (llama.cpp-owned prefix reuse) and ``id_slot`` (a general
slot from :class:`~werk_llamacpp.process.SlotPicker`, never a slot reserved for named states).
``n``/``n_cmpl`` other than 1 are refused: llama-server runs the extra choices in *other* free
slots, which could be a state slot.

**Pinned slots.** An in-process caller that owns a state slot (the terminal chat's native
snapshot provider, :mod:`~werk_llamacpp.chat_snapshots`) puts a :class:`PinnedSlot` object in
``body["id_slot"]``; the request then goes to that state slot instead of a picked general slot.
A ``PinnedSlot`` is a Python object, so a JSON body from an HTTP client can never carry one (a
client's integer ``id_slot`` is replaced as always). It must name one of this child's state
slots and its generation.

**Streaming** is relayed as it arrives: the child's SSE is parsed incrementally and each
``data:`` payload is yielded as bare bytes (the host adds ``data:`` and the final ``[DONE]``);
``[DONE]`` ends the relay, an ``{"error": …}`` event becomes a Werk error.

**The hop** goes through the host's :class:`werk.LoopbackClient` (pooled keep-alive
connections, no general-purpose client on the hot path); the request body is encoded once, and
a non-streamed reply is decoded once to put Werk's model id into it.

**One retry.** This llama-server closes a kept-alive connection after a number of requests and
sometimes right after a streamed response; the next request on it then fails before any
response byte. Such a failure (:class:`werk.NotSent`: connection refused or reset, a write
error, the connection closed before a status line) is retried exactly once, on a new
connection. A failure after the first response byte (half a status line, a cut body or stream)
is never retried.

**Errors.** A child's error body is never forwarded: 400 becomes ``invalid_request`` with
Werk's own message (a context overflow names the token counts, which are numbers, not backend
text), 501 ``unsupported``, 503 ``unavailable``, anything else ``backend_error``. The child's
text goes only to the server log.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import msgspec

from werk import (
    BackendError,
    InvalidRequest,
    LoopbackError,
    LoopbackResponse,
    LoopbackTimeout,
    NotSent,
    OpenAICall,
    OpenAIReply,
    ResponseTooLarge,
    Runtime,
    Unavailable,
    Unsupported,
    WerkError,
    WerkTimeout,
)

from .process import ManagedHandle, check_alive

__all__ = ["PinnedSlot", "SSEStream", "map_backend_error", "openai_reply"]

log = logging.getLogger("werk.llamacpp")

ROUTES = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024
DRAIN_SECONDS = 1.0


def _handle(runtime: Runtime) -> ManagedHandle:
    handle = runtime.handle
    if not isinstance(handle, ManagedHandle) or not check_alive(runtime):
        raise Unavailable(
            f"the llama-server process of model {runtime.model.id!r} is not running; "
            "the next request starts a new one",
            retryable=True,
        )
    return handle


def _int_field(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def map_backend_error(status: int, content: bytes) -> WerkError:
    """Werk's own error for a child's error response (its body only informs the choice)."""
    try:
        detail = msgspec.json.decode(content[:MAX_ERROR_BYTES]).get("error")
    except (msgspec.DecodeError, AttributeError):
        detail = None
    detail = detail if isinstance(detail, dict) else {}
    kind = detail.get("type")
    if status == 400:
        if kind == "exceed_context_size_error":
            n_prompt, n_ctx = (
                _int_field(detail.get("n_prompt_tokens")),
                _int_field(detail.get("n_ctx")),
            )
            if n_prompt is not None and n_ctx is not None:
                return InvalidRequest(
                    f"the prompt ({n_prompt} tokens) exceeds the context of one llama.cpp slot "
                    f"({n_ctx} tokens)"
                )
            return InvalidRequest("the prompt exceeds the context of one llama.cpp slot")
        return InvalidRequest(
            "llama-server rejected the request as invalid; check its fields and their values"
        )
    if status == 501:
        return Unsupported("llama-server does not support this request for this model")
    if status == 503:
        return Unavailable("llama-server is not ready to serve this request", retryable=True)
    return BackendError(f"llama-server failed the request (HTTP {status})")


class PinnedSlot(msgspec.Struct, frozen=True):
    """``body["id_slot"]`` from an in-process owner of a state slot (see the module docstring).

    :ivar slot: one of the child's ``state_slots``.
    :ivar generation: the child's process generation the owner acquired the slot in.
    """

    slot: int
    generation: str


def _pinned_slot(handle: ManagedHandle, call: OpenAICall) -> int | None:
    """The state slot a :class:`PinnedSlot` names, or ``None`` when the body carries none."""
    pin = call.body.get("id_slot")
    if not isinstance(pin, PinnedSlot):
        return None
    if pin.generation != handle.generation or pin.slot not in handle.state_slots:
        raise BackendError("a pinned slot does not belong to this llama-server's state slots")
    return pin.slot


def _prompt_key(call: OpenAICall) -> str:
    source = call.body.get("messages" if call.route == "chat.completions" else "prompt")
    if isinstance(source, str):
        return source
    try:
        return msgspec.json.encode(source).decode("utf-8", "replace")
    except (TypeError, msgspec.EncodeError):
        return ""


def _prepare(handle: ManagedHandle, call: OpenAICall) -> dict[str, Any]:
    for key in ("n", "n_cmpl"):
        value = call.body.get(key)
        if value is not None and value != 1:
            raise InvalidRequest(
                f"{key!r} must be 1: the llama.cpp backend returns one choice per request"
            )
    body = dict(call.body)
    body["model"] = handle.model_alias
    body["cache_prompt"] = True
    body["stream"] = call.stream
    return body


def _transport_failure(runtime: Runtime, exc: Exception) -> WerkError:
    if isinstance(exc, LoopbackTimeout):
        return WerkTimeout("llama-server did not answer in time")
    if isinstance(exc, ResponseTooLarge):
        return BackendError("llama-server's response exceeded Werk's size limit")
    if not check_alive(runtime):
        return Unavailable(
            f"the llama-server process of model {runtime.model.id!r} exited; "
            "the next request starts a new one",
            retryable=True,
        )
    return BackendError("llama-server closed the connection without an answer")


async def _send(
    runtime: Runtime, handle: ManagedHandle, path: str, content: bytes
) -> LoopbackResponse:
    try:
        return await handle.v1.request("POST", path, body=content)
    except NotSent as exc:
        log.debug("llama-server request failed before a response (%s); retrying once", exc)
    except LoopbackError as exc:
        raise _transport_failure(runtime, exc) from None
    try:
        return await handle.v1.request("POST", path, body=content, fresh=True)
    except LoopbackError as exc:
        raise _transport_failure(runtime, exc) from None


class _Lease:
    """A picked slot, released exactly once."""

    def __init__(self, release: Callable[[int], None], slot: int) -> None:
        self._release: Callable[[int], None] | None = release
        self.slot = slot

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self.slot)


async def openai_reply(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    """The ``werk_openai`` hook: proxy one request to the runtime's child."""
    handle = _handle(runtime)
    body = _prepare(handle, call)
    pinned = _pinned_slot(handle, call)
    if pinned is not None:
        lease = _Lease(lambda _slot: None, pinned)  # the owner holds the slot; nothing to free
    else:
        lease = _Lease(handle.picker.release, handle.picker.acquire(_prompt_key(call)))
    body["id_slot"] = lease.slot
    try:
        content = msgspec.json.encode(body)
        response = await _send(runtime, handle, ROUTES[call.route], content)
    except BaseException:
        lease.release()
        raise
    try:
        if response.status != 200:
            raw = await response.read(MAX_ERROR_BYTES * 16)
            log.warning(
                "llama-server answered HTTP %s: %s",
                response.status,
                raw[:MAX_ERROR_BYTES].decode("utf-8", "replace"),
            )
            raise map_backend_error(response.status, raw)
        if call.stream:
            if not response.content_type.startswith("text/event-stream"):
                raise BackendError("llama-server did not stream its reply")
            rename = runtime.model.id if handle.model_alias != runtime.model.id else None
            return OpenAIReply(stream=SSEStream(runtime, response, lease, rename=rename))
        raw = await response.read(MAX_BODY_BYTES)
    except LoopbackError as exc:
        lease.release()
        await _aclose(response)
        raise _transport_failure(runtime, exc) from None
    except BaseException:
        lease.release()
        await _aclose(response)
        raise
    lease.release()
    await _aclose(response)
    try:
        data = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        data = None
    if not isinstance(data, dict):
        raise BackendError("llama-server answered with something that is not a JSON object")
    if "model" in data:
        data["model"] = runtime.model.id
    return OpenAIReply(body=data)


async def _aclose(response: LoopbackResponse) -> None:
    try:
        await response.aclose()
    except Exception:
        log.debug("closing a llama-server response failed", exc_info=True)


class SSEStream:
    """The child's SSE reply as bare ``data`` payloads, read incrementally.

    The host calls :meth:`aclose` whenever the exchange ends (completed, failed, or the client
    went away, even before the first ``__anext__``): that frees the slot and closes the child's
    response, which makes llama-server cancel the generation.
    """

    def __init__(
        self,
        runtime: Runtime,
        response: LoopbackResponse,
        lease: _Lease,
        *,
        rename: str | None = None,
    ) -> None:
        self._runtime = runtime
        self._response = response
        self._lease = lease
        self._rename = rename
        self._chunks: AsyncIterator[bytes] = aiter(response)
        self._buffer = b""
        self._data: list[bytes] = []
        self._ready: collections.deque[bytes] = collections.deque()
        self._done = False
        self._finished = False

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            while not self._ready:
                if self._done:
                    raise StopAsyncIteration
                await self._fill()
            return self._ready.popleft()
        except BaseException:
            await self.aclose()
            raise

    async def _fill(self) -> None:
        try:
            chunk = await self._chunks.__anext__()
        except StopAsyncIteration:
            self._done = True
            if self._buffer.strip() or self._data:
                self._line(self._buffer)
                self._line(b"")
            return
        except LoopbackError as exc:
            raise _transport_failure(self._runtime, exc) from None
        self._buffer += chunk
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise BackendError("llama-server sent an oversized stream event")
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            self._line(line)
            if self._done:
                return

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if line:
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line.startswith(b"event:") and line[6:].strip() == b"error":
                self._data.append(b'{"error":{}}')  # its data line follows; the type decides
            return  # comments (":" pings), id:, retry: are ignored
        if not self._data:
            return
        payload = b"\n".join(self._data)
        self._data = []
        if payload == b"[DONE]":
            self._done = self._finished = True
            return
        if payload.startswith(b'{"error"'):
            log.warning("llama-server stream error: %s", payload[:MAX_ERROR_BYTES].decode())
            raise _stream_error(payload)
        if self._rename is not None:
            payload = _renamed(payload, self._rename)
        self._ready.append(payload)

    async def aclose(self) -> None:
        finished, self._done = self._finished, True
        self._lease.release()
        if finished:
            await self._drain()
        await _aclose(self._response)

    async def _drain(self) -> None:
        """After ``[DONE]`` read the (tiny) rest of the body, so the connection can return to
        the pool; an abandoned stream is closed instead, which cancels the generation."""
        drained = 0
        try:
            with anyio.fail_after(DRAIN_SECONDS):
                async for chunk in self._chunks:
                    drained += len(chunk)
                    if drained > MAX_ERROR_BYTES:
                        return
        except (TimeoutError, LoopbackError):
            return


def _stream_error(payload: bytes) -> WerkError:
    try:
        detail = msgspec.json.decode(payload.split(b"\n")[-1]).get("error")
    except (msgspec.DecodeError, AttributeError):
        detail = None
    code = detail.get("code") if isinstance(detail, dict) else None
    status = code if isinstance(code, int) and not isinstance(code, bool) else 500
    return map_backend_error(status, msgspec.json.encode({"error": detail or {}}))


def _renamed(payload: bytes, model: str) -> bytes:
    try:
        data = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload
    if isinstance(data, dict) and "model" in data:
        data["model"] = model
        return msgspec.json.encode(data)
    return payload
