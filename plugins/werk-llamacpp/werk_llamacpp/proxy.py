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

**The hop** is the host's one relay, :func:`werk.openai_upstream`, over the handle's pooled
:class:`werk.LoopbackClient`: the body is encoded once; streamed payloads pass through unchanged
(a chunk that names the child's model alias is renamed to Werk's id); a finished stream is
drained so its connection is reused; a request that failed before any response byte is sent
once more on a new connection (this llama-server closes a kept-alive connection after a number
of requests and sometimes right after a streamed response), a failure after the first response
byte never is. The slot lease is released exactly once, when the exchange ends.

**Errors** are the host's map; what is llama.cpp's own: a context overflow names its token
counts (numbers, not backend text), and a failed exchange says whether the child process
exited. The child's text goes only to the server log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec

from werk import (
    BackendError,
    BrokenResponse,
    InvalidRequest,
    LoopbackError,
    NotSent,
    OpenAICall,
    OpenAIReply,
    Runtime,
    Unavailable,
    UpstreamErrors,
    WerkError,
    openai_upstream,
)

from .process import ManagedHandle, check_alive

__all__ = ["PinnedSlot", "openai_reply"]

log = logging.getLogger("werk.llamacpp")

ROUTES = {
    "chat.completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
WHAT = "llama-server"


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


def context_overflow(status: int, error: dict[str, Any]) -> WerkError | None:
    """llama-server's ``exceed_context_size_error``, in Werk's words (the host maps the rest)."""
    if status != 400 or error.get("type") != "exceed_context_size_error":
        return None
    n_prompt, n_ctx = _int_field(error.get("n_prompt_tokens")), _int_field(error.get("n_ctx"))
    if n_prompt is not None and n_ctx is not None:
        return InvalidRequest(
            f"the prompt ({n_prompt} tokens) exceeds the context of one llama.cpp slot "
            f"({n_ctx} tokens)",
            param="messages",
            openai_code="context_length_exceeded",
        )
    return InvalidRequest(
        "the prompt exceeds the context of one llama.cpp slot",
        param="messages",
        openai_code="context_length_exceeded",
    )


def _child_failure(runtime: Runtime) -> Callable[[LoopbackError], WerkError | None]:
    """A failed exchange: the child exited (retryable), or it dropped an unanswered request."""

    def read(exc: LoopbackError) -> WerkError | None:
        if not isinstance(exc, (NotSent, BrokenResponse)):
            return None  # a timeout or an oversized answer: the host's words
        if not check_alive(runtime):
            return Unavailable(
                f"the llama-server process of model {runtime.model.id!r} exited; "
                "the next request starts a new one",
                retryable=True,
            )
        if isinstance(exc, NotSent):
            return BackendError("llama-server closed the connection without an answer")
        return None

    return read


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
    if call.route == "embeddings":
        return body  # no slot or prompt cache: llama-server spreads embeddings itself
    body["cache_prompt"] = True
    body["stream"] = call.stream
    return body


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
    """The ``werk_openai`` hook: relay one request to the runtime's child."""
    handle = _handle(runtime)
    body = _prepare(handle, call)
    pinned = _pinned_slot(handle, call)
    if pinned is not None:
        lease = _Lease(lambda _slot: None, pinned)  # the owner holds the slot; nothing to free
    elif call.route == "embeddings":
        lease = _Lease(lambda _slot: None, -1)
    else:
        lease = _Lease(handle.picker.release, handle.picker.acquire(_prompt_key(call)))
    if lease.slot >= 0:
        body["id_slot"] = lease.slot
    try:
        content = msgspec.json.encode(body)
    except BaseException:
        lease.release()
        raise
    return await openai_upstream(
        handle.v1,
        ROUTES[call.route],
        content,
        stream=call.stream,
        what=WHAT,
        model=runtime.model.id if handle.model_alias != runtime.model.id else None,
        errors=UpstreamErrors(status=context_overflow, transport=_child_failure(runtime)),
        on_close=lease.release,
        logger=log,
    )
