"""State slots of one llama-server child: who owns which slot, and the ``/slots`` API.

**Ownership.** Named states live in the child's *state slots* (``LlamaHandle.state_slots``,
never used by ``/v1``); who owns which, and who waits for one, is
:mod:`werk_llamacpp.slot_allocator`'s (re-exported here).

**Slot-bound inference** (:func:`complete_in_slot`) sends token ids to ``/completion`` with
``cache_prompt: true`` and an explicit ``id_slot``, and returns the server's own reuse evidence:
``timings.cache_n`` (prompt tokens taken from the slot's KV cells) and ``timings.prompt_n``
(prompt tokens computed). ``tokens_cached`` is only the slot's length and proves nothing.

**The API** (llama-server with ``--slot-save-path``), as observed on build 11434::

    POST /slots/{id}?action=save    {"filename": F} -> {id_slot, filename, n_saved, n_written}
    POST /slots/{id}?action=restore {"filename": F} -> {id_slot, filename, n_restored, n_read}
    POST /slots/{id}?action=erase                   -> {id_slot, n_erased}
    GET  /slots                                     -> [{id, n_ctx, is_processing, ...}]

Errors come back as ``{"error": {"code", "message", "type"}}`` (HTTP 400 for an unreadable file
or a bad name, 501 without ``--slot-save-path``). The server *wraps* out-of-range slot ids
(``/slots/5`` with two slots acts on slot 1), so every id is validated here against
``total_slots`` and the handle's state slots before a request is sent. File names are generated
here only (``werk-<purpose>-<random>.slot``); the server would reject ``..`` and ``/`` anyway.
A save does not fsync; :func:`save_slot` leaves that to the caller, who owns the file.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio
import msgspec

from werk import (
    BackendError,
    ChatMessage,
    EventTooLarge,
    InsufficientStorage,
    InvalidRequest,
    LoopbackError,
    LoopbackResponse,
    LoopbackTimeout,
    NotSent,
    ResponseTooLarge,
    SSEDecoder,
    Unavailable,
    storage_refusal,
)

from .handle import LlamaHandle
from .slot_allocator import SlotAllocator, SlotState, allocator_for, check_state_slot

__all__ = [
    "Completion",
    "EraseAck",
    "LlamaRefused",
    "RestoreAck",
    "SaveAck",
    "SlotAllocator",
    "SlotState",
    "allocator_for",
    "check_state_slot",
    "complete_in_slot",
    "disk_full",
    "erase_slot",
    "llama_json",
    "new_slot_filename",
    "new_slot_filename_ok",
    "render_messages",
    "restore_slot",
    "save_slot",
    "slot_is_idle",
    "tokenize",
]

log = logging.getLogger("werk.llamacpp")

SLOT_IO_TIMEOUT = 300.0
"""Seconds for a slot save, restore or erase: saving or restoring a multi-gigabyte slot is
disk-bound; the bound is generous on purpose."""
ANSWER_LIMIT_BYTES = 64 << 20
"""The largest JSON answer read from the child (a ``/slots`` listing, a completion)."""

_FILENAME = re.compile(r"^werk-[a-z]+-[0-9a-f]{32}\.slot$")


def new_slot_filename(purpose: str) -> str:
    """A fresh Werk-generated file name for the slot directory (``werk-<purpose>-<hex>.slot``)."""
    name = f"werk-{purpose}-{secrets.token_hex(16)}.slot"
    if not _FILENAME.match(name):
        raise ValueError(f"slot file purpose {purpose!r} must be lower-case letters")
    return name


# -- HTTP --------------------------------------------------------------------------------------


class LlamaRefused(Exception):
    """llama-server answered with an HTTP error. ``summary`` is Werk's one-line description;
    the server's own message is kept for the log only."""

    def __init__(self, what: str, status: int, error_type: str, server_message: str) -> None:
        self.status = status
        self.error_type = error_type
        self.server_message = server_message
        self.summary = f"llama-server refused {what} (HTTP {status} {error_type})"
        super().__init__(self.summary)


def _error_fields(raw: bytes) -> tuple[str, str]:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return "unknown", ""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return "unknown", ""
    kind, message = error.get("type"), error.get("message")
    return (
        kind if isinstance(kind, str) and kind.isidentifier() else "unknown",
        message if isinstance(message, str) else "",
    )


async def _send(
    handle: LlamaHandle, method: str, path: str, payload: bytes, what: str
) -> LoopbackResponse:
    """The child's response to one request, through the host's loopback client
    (``handle.http``). A request that fails *before any response byte* (this llama-server
    sometimes closes a pooled keep-alive connection right after a streamed response) is retried
    once, on a new connection: nothing was received, so the server did not answer it twice."""
    try:
        return await handle.http.request(method, path, body=payload)
    except NotSent:
        log.debug("llama-server dropped a connection before %s; retrying once", what)
        return await handle.http.request(method, path, body=payload, fresh=True)


@contextlib.contextmanager
def _exchange_errors(what: str, timeout: float) -> Iterator[None]:
    """Bound an exchange with the child by ``timeout`` (both tries) and turn the loopback's
    failures into Werk errors naming ``what``."""
    try:
        with anyio.fail_after(timeout):
            yield
    except (TimeoutError, LoopbackTimeout):
        raise BackendError(f"llama-server did not finish {what} in time") from None
    except ResponseTooLarge:
        raise BackendError(f"llama-server's answer to {what} is too large") from None
    except LoopbackError:
        raise Unavailable(f"llama-server is not answering ({what})", retryable=True) from None


def _refused(what: str, status: int, raw: bytes) -> LlamaRefused:
    error_type, message = _error_fields(raw)
    log.warning("llama-server refused %s: HTTP %s %s", what, status, message)
    return LlamaRefused(what, status, error_type, message)


async def llama_json(
    handle: LlamaHandle,
    method: str,
    path: str,
    what: str,
    *,
    body: dict[str, Any] | None = None,
    timeout: float = SLOT_IO_TIMEOUT,
) -> Any:
    """Send one JSON request to the child and return the decoded JSON answer (retried once
    where nothing of a response arrived, :func:`_send`; ``timeout`` bounds both tries).

    :param what: a few words for errors (``"slot save"``).
    :raises LlamaRefused: the server answered with an HTTP error status.
    :raises werk.Unavailable: the child does not answer (it is probably dead).
    :raises werk.BackendError: no answer in time, or the answer is not JSON.
    """
    payload = b"" if body is None else msgspec.json.encode(body)
    with _exchange_errors(what, timeout):
        async with await _send(handle, method, path, payload, what) as response:
            status, raw = response.status, await response.read(ANSWER_LIMIT_BYTES)
    if status >= 400:
        raise _refused(what, status, raw)
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise BackendError(f"llama-server's answer to {what} is not JSON") from None


async def _streamed_completion(
    handle: LlamaHandle,
    body: dict[str, Any],
    on_text: Callable[[str], Awaitable[None]],
    timeout: float,
) -> Any:
    """``/completion`` with ``stream: true``: ``on_text`` is awaited with each piece of the
    content as it arrives; the answer is the final event (which carries everything a
    non-streamed answer does but the content) with the pieces joined as its ``content``.
    Errors as :func:`llama_json`'s; an exception of ``on_text`` closes the stream (the server
    then stops generating) and propagates."""
    payload = msgspec.json.encode({**body, "stream": True})
    pieces: list[str] = []
    try:
        with _exchange_errors("completion", timeout):
            async with await _send(handle, "POST", "/completion", payload, "completion") as answer:
                if answer.status >= 400:
                    raise _refused(
                        "completion", answer.status, await answer.read(ANSWER_LIMIT_BYTES)
                    )
                decoder = SSEDecoder(max_event_bytes=ANSWER_LIMIT_BYTES)
                async for chunk in answer:
                    for data in decoder.feed(chunk):
                        event = msgspec.json.decode(data)
                        if not isinstance(event, dict) or "error" in event:
                            raise BackendError("llama-server failed while streaming a completion")
                        if event.get("stop") is True:
                            event["content"] = "".join(pieces)
                            return event
                        piece = event.get("content")
                        if isinstance(piece, str) and piece:
                            pieces.append(piece)
                            await on_text(piece)
    except msgspec.DecodeError:
        raise BackendError("llama-server's streamed completion is not JSON") from None
    except EventTooLarge:
        raise BackendError("llama-server's streamed completion has an oversized event") from None
    raise BackendError("llama-server ended its completion stream before the final event")


_Ack = TypeVar("_Ack", bound=msgspec.Struct)


def _ack(kind: type[_Ack], data: Any, what: str) -> _Ack:
    try:
        return msgspec.convert(data, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise BackendError(f"llama-server's answer to {what} is malformed ({exc})") from None


class SaveAck(msgspec.Struct, frozen=True):
    id_slot: int
    filename: str
    n_saved: int
    n_written: int


class RestoreAck(msgspec.Struct, frozen=True):
    id_slot: int
    filename: str
    n_restored: int
    n_read: int


class EraseAck(msgspec.Struct, frozen=True):
    id_slot: int
    n_erased: int


def _check_echo(ack: SaveAck | RestoreAck | EraseAck, slot: int, filename: str | None) -> None:
    if ack.id_slot != slot:
        raise BackendError(f"llama-server acknowledged slot {ack.id_slot}, not slot {slot}")
    if filename is not None and getattr(ack, "filename", filename) != filename:
        raise BackendError("llama-server acknowledged another file name than the one sent")


DISK_FULL_BYTES = 1 << 20
"""Free space under which a failed write into the slot directory is put down to a full disk."""


def disk_full(directory: Path, action: str) -> InsufficientStorage | None:
    """:class:`werk.InsufficientStorage` when the disk that holds ``directory`` (the slot
    directory) is (nearly) full: llama-server reports a failed save without its reason, and a
    save into a full disk may even be acknowledged whole while its file is short."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return None
    if info.f_bavail * info.f_frsize >= DISK_FULL_BYTES:
        return None
    refusal = storage_refusal(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), action)
    return refusal if isinstance(refusal, InsufficientStorage) else None


async def save_slot(handle: LlamaHandle, slot: int, filename: str) -> SaveAck:
    """``action=save`` of ``slot`` into ``handle.slot_dir / filename`` (not fsynced).

    :raises werk.BackendError: refused, malformed, or an acknowledgement of nothing saved.
    """
    check_state_slot(handle, slot)
    new_slot_filename_ok(filename)
    try:
        data = await llama_json(
            handle, "POST", f"/slots/{slot}?action=save", "slot save", body={"filename": filename}
        )
    except LlamaRefused as exc:
        raise disk_full(handle.slot_dir, "save a state slot") or BackendError(exc.summary) from None
    ack = _ack(SaveAck, data, "slot save")
    _check_echo(ack, slot, filename)
    if ack.n_saved <= 0 or ack.n_written <= 0:
        raise BackendError(
            f"llama-server saved {ack.n_saved} tokens in {ack.n_written} bytes from slot {slot}"
        )
    return ack


async def restore_slot(handle: LlamaHandle, slot: int, filename: str) -> RestoreAck:
    """``action=restore`` of ``handle.slot_dir / filename`` into ``slot``.

    The acknowledged counts are returned unchecked: the caller compares them with what it knows
    about the file. llama-server clears the slot itself when a restore fails.

    :raises werk.BackendError: refused or malformed.
    """
    check_state_slot(handle, slot)
    new_slot_filename_ok(filename)
    try:
        data = await llama_json(
            handle,
            "POST",
            f"/slots/{slot}?action=restore",
            "slot restore",
            body={"filename": filename},
        )
    except LlamaRefused as exc:
        raise BackendError(exc.summary) from None
    ack = _ack(RestoreAck, data, "slot restore")
    _check_echo(ack, slot, filename)
    return ack


async def erase_slot(handle: LlamaHandle, slot: int) -> int:
    """``action=erase`` of ``slot``; returns how many tokens it held (``n_erased``).

    :raises werk.BackendError: refused or malformed.
    """
    check_state_slot(handle, slot)
    try:
        data = await llama_json(handle, "POST", f"/slots/{slot}?action=erase", "slot erase")
    except LlamaRefused as exc:
        raise BackendError(exc.summary) from None
    ack = _ack(EraseAck, data, "slot erase")
    _check_echo(ack, slot, None)
    if ack.n_erased < 0:
        raise BackendError(f"llama-server erased {ack.n_erased} tokens")
    return ack.n_erased


class _SlotInfo(msgspec.Struct, frozen=True):
    id: int
    is_processing: bool


async def slot_is_idle(handle: LlamaHandle, slot: int) -> bool:
    """Whether ``GET /slots`` reports ``slot`` as not processing.

    :raises werk.BackendError: the monitoring endpoint is off (``--no-slots``), or the slot is
        missing from its answer: idleness cannot be shown, so Werk does not assume it.
    """
    check_state_slot(handle, slot)
    try:
        data = await llama_json(handle, "GET", "/slots", "slot listing", timeout=30.0)
    except LlamaRefused as exc:
        raise BackendError(exc.summary) from None
    slots = _ack(_SlotList, {"slots": data}, "slot listing").slots
    matches = [s for s in slots if s.id == slot]
    if len(matches) != 1:
        raise BackendError(f"llama-server's slot listing does not show slot {slot} once")
    return not matches[0].is_processing


class _SlotList(msgspec.Struct, frozen=True):
    slots: list[_SlotInfo]


def new_slot_filename_ok(filename: str) -> str:
    """``filename`` if it is a name :func:`new_slot_filename` could have produced."""
    if not _FILENAME.match(filename):
        raise BackendError("refusing a slot file name that Werk did not generate")
    return filename


# -- slot-bound inference ----------------------------------------------------------------------

INFERENCE_TIMEOUT = 3600.0
"""A long prompt on a large model on CPUs can take minutes to prefill."""


class Timings(msgspec.Struct, frozen=True):
    cache_n: int
    prompt_n: int
    predicted_n: int


class TopLogprob(msgspec.Struct, frozen=True):
    """One candidate of a generated token's distribution (``n_probs``)."""

    id: int
    logprob: float


class TokenProbabilities(msgspec.Struct, frozen=True):
    """A generated token and its ``n_probs`` most likely candidates (before sampling)."""

    id: int
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()


class Completion(msgspec.Struct, frozen=True):
    """The fields of a non-streamed ``/completion`` answer that Werk relies on.

    :ivar completion_probabilities: per generated token, when the request asked ``n_probs``.
    """

    content: str
    id_slot: int
    stop_type: str
    truncated: bool
    tokens_predicted: int
    timings: Timings
    completion_probabilities: tuple[TokenProbabilities, ...] = ()


def _inference_error(exc: LlamaRefused) -> Exception:
    if exc.error_type == "exceed_context_size_error":
        return InvalidRequest("the prompt does not fit in the context of a llama-server state slot")
    return BackendError(exc.summary)


async def tokenize(handle: LlamaHandle, text: str) -> tuple[int, ...]:
    """The token ids ``/completion`` itself would evaluate for ``text``.

    ``/completion`` tokenizes a string prompt with special tokens added and parsed
    (``add_special``/``parse_special`` true); ``/tokenize`` is asked for exactly that.
    """
    try:
        data = await llama_json(
            handle,
            "POST",
            "/tokenize",
            "tokenization",
            body={"content": text, "add_special": True, "parse_special": True},
            timeout=INFERENCE_TIMEOUT,
        )
    except LlamaRefused as exc:
        raise BackendError(exc.summary) from None
    tokens = _ack(_Tokens, data, "tokenization").tokens
    if not tokens:
        raise InvalidRequest("the prompt is empty after tokenization")
    return tuple(tokens)


class _Tokens(msgspec.Struct, frozen=True):
    tokens: list[int]


class _Rendered(msgspec.Struct, frozen=True):
    prompt: str


async def render_messages(handle: LlamaHandle, messages: Sequence[ChatMessage]) -> str:
    """The prompt text the child's chat template makes of ``messages``.

    Uses the child's own ``POST /apply-template`` (the same rendering ``/v1/chat/completions``
    applies, with the generation prompt appended), so a prefilled chat and a proxied chat agree
    token for token. A server without that route cannot prefill messages.
    """
    body = {"messages": [{"role": m.role, "content": m.content} for m in messages]}
    try:
        data = await llama_json(
            handle, "POST", "/apply-template", "chat template rendering", body=body, timeout=60.0
        )
    except LlamaRefused as exc:
        if exc.status == 404:
            raise Unavailable(
                "this llama-server cannot render chat templates (/apply-template is missing); "
                "send a prompt instead of messages",
                capability="runtime.pd.prefill",
            ) from None
        raise BackendError(exc.summary) from None
    return _ack(_Rendered, data, "chat template rendering").prompt


async def complete_in_slot(
    handle: LlamaHandle,
    slot: int,
    tokens: Sequence[int],
    *,
    n_predict: int,
    temperature: float = 0.0,
    seed: int | None = None,
    stop: Sequence[str] = (),
    n_probs: int = 0,
    on_text: Callable[[str], Awaitable[None]] | None = None,
) -> Completion:
    """Evaluate ``tokens`` in ``slot`` (reusing its cached prefix) and generate ``n_predict``.

    ``n_predict: 0`` is accepted by this server: it evaluates the whole prompt into the slot,
    samples one token (``tokens_predicted: 1``) and stops without evaluating that token, so the
    slot then holds exactly the prompt. ``temperature <= 0`` is greedy decoding. ``n_probs > 0``
    asks for each generated token's ``n_probs`` most likely candidates and their
    log-probabilities (``Completion.completion_probabilities``). With ``on_text`` the completion
    is streamed: ``on_text`` is awaited with each piece of the content as it is generated.

    :raises werk.InvalidRequest: the prompt exceeds the slot's context.
    :raises werk.BackendError: refused, malformed, or answered from another slot.
    """
    check_state_slot(handle, slot)
    body: dict[str, Any] = {
        "prompt": list(tokens),
        "n_predict": n_predict,
        "cache_prompt": True,
        "id_slot": slot,
        "temperature": temperature,
        "stream": False,
    }
    if seed is not None:
        body["seed"] = seed
    if stop:
        body["stop"] = list(stop)
    if n_probs > 0:
        body["n_probs"] = n_probs
    try:
        if on_text is None:
            data = await llama_json(
                handle, "POST", "/completion", "completion", body=body, timeout=INFERENCE_TIMEOUT
            )
        else:
            data = await _streamed_completion(handle, body, on_text, INFERENCE_TIMEOUT)
    except LlamaRefused as exc:
        raise _inference_error(exc) from None
    answer = _ack(Completion, data, "completion")
    if answer.id_slot != slot:
        raise BackendError(f"llama-server answered from slot {answer.id_slot}, not slot {slot}")
    timings = answer.timings
    if min(timings.cache_n, timings.prompt_n) < 0 or timings.cache_n + timings.prompt_n != len(
        tokens
    ):
        raise BackendError(
            "llama-server's prompt accounting is inconsistent "
            f"(cache_n {timings.cache_n} + prompt_n {timings.prompt_n} != {len(tokens)} tokens)"
        )
    return answer
