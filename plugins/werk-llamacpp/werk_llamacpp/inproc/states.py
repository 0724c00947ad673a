"""Named states of ``llamacpp-inproc``: prefill, decode, snapshot and restore.

A live state is a :class:`~werk_llamacpp.inproc.sessions.Saved` (the sequence's tokens and
llama.cpp's bytes for them) held by the host's volatile store as a ``handle`` bound to the
runtime's generation. A persisted state is opaque bytes (:func:`encode`)::

    b"WERKLCPI1\\n"                           magic and layout version
    {"tokens": N, "data_bytes": M, "sha256": H}\\n   one JSON line
    N little-endian int32 token ids, then M bytes of llama.cpp's sequence state

with ``H`` the SHA-256 of everything after the JSON line; anything else is refused before it
reaches llama.cpp. A restore loads the bytes into the context to prove llama.cpp accepts them
(a refusal leaves the sequence empty). Which model, library and context settings a state belongs
to is the host's compatibility envelope (``runtime.py`` sets its executable, arguments and cache
layout), checked before these hooks are called.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import TYPE_CHECKING, Any

import anyio

from werk import (
    BackendError,
    BackendState,
    DecodeCall,
    DecodeOutcome,
    FinishReason,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    StateKind,
)

from .sessions import Saved, shared_prefix

if TYPE_CHECKING:
    from .runtime import InprocHandle

__all__ = ["decode", "decode_payload", "encode", "erase", "prefill", "restore", "snapshot"]

MAGIC = b"WERKLCPI1\n"
MAX_HEADER = 256


def encode(saved: Saved) -> bytes:
    body = struct.pack(f"<{len(saved.tokens)}i", *saved.tokens) + saved.data
    header = {
        "tokens": len(saved.tokens),
        "data_bytes": len(saved.data),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + body


def decode_payload(raw: bytes) -> Saved:
    """:raises werk.BackendError: not a complete, undamaged state of this layout."""
    if not raw.startswith(MAGIC):
        raise BackendError("not a llamacpp-inproc state (unknown layout)")
    end = raw.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER)
    try:
        if end < 0:
            raise ValueError("no header line")
        header = json.loads(raw[len(MAGIC) : end])
        count, size, digest = header["tokens"], header["data_bytes"], header["sha256"]
    except (ValueError, TypeError, KeyError):
        raise BackendError("the llamacpp-inproc state's header is damaged") from None
    body = raw[end + 1 :]
    if not (isinstance(count, int) and isinstance(size, int) and count >= 0 and size >= 0) or (
        len(body) != 4 * count + size
    ):
        raise BackendError("the llamacpp-inproc state is incomplete")
    if hashlib.sha256(body).hexdigest() != digest:
        raise BackendError("the llamacpp-inproc state's checksum does not match")
    tokens = struct.unpack(f"<{count}i", body[: 4 * count])
    return Saved(tuple(tokens), body[4 * count :])


def _handle(runtime: Runtime) -> InprocHandle:
    return runtime.handle  # type: ignore[no-any-return]


def _live(runtime: Runtime, saved: Saved) -> BackendState:
    return BackendState(
        kind=StateKind.HANDLE,
        handle=saved,
        generation=runtime.generation,
        tokens=len(saved.tokens),
        logical_bytes=len(saved.data),
    )


async def _saved(runtime: Runtime, state: BackendState) -> Saved:
    """The :class:`Saved` a state stands for (a live handle of this generation, or bytes)."""
    if state.kind is StateKind.HANDLE:
        if state.generation != runtime.generation or not isinstance(state.handle, Saved):
            raise BackendError("the state belongs to another runtime generation")
        return state.handle
    if state.kind is StateKind.BYTES and state.data is not None:
        return decode_payload(state.data)
    if state.kind is StateKind.FILE and state.path is not None:
        return decode_payload(await anyio.Path(state.path).read_bytes())
    raise BackendError(f"llamacpp-inproc cannot use a {state.kind} state")


def _messages(call: PrefillCall) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": m.content} for m in call.messages or ()]


async def prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    handle = _handle(runtime)
    engine = handle.engine
    reuse = await _saved(runtime, call.reuse_from) if call.reuse_from is not None else None

    def work() -> PrefillOutcome:
        if call.prompt is not None:
            tokens = engine.prompt_tokens(call.prompt)
        else:
            tokens = engine.chat_tokens(_messages(call))
        restored = None
        if reuse is not None:
            engine.restore(reuse)
            restored = shared_prefix(reuse.tokens, tokens)
        evaluation = engine.evaluate(tokens)
        kept = engine.save()
        return PrefillOutcome(
            state=_live(runtime, kept),
            prompt_tokens=evaluation.prompt_tokens,
            cached_tokens=evaluation.cached,
            restored_tokens=restored,
        )

    return await handle.lane.run(work)


async def decode(runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
    handle = _handle(runtime)
    engine = handle.engine
    saved = await _saved(runtime, call.state)

    def work() -> tuple[str, str, int]:
        engine.restore(saved)
        return engine.complete(
            list(saved.tokens),
            max_tokens=call.max_tokens,
            temperature=call.temperature,
            seed=call.seed,
            stops=list(call.stop),
            sessions=False,
        )

    text, finish, count = await handle.lane.run(work)
    return DecodeOutcome(text=text, finish_reason=FinishReason(finish), completion_tokens=count)


async def snapshot(runtime: Runtime, state: BackendState) -> BackendState:
    payload = encode(await _saved(runtime, state))
    return BackendState(
        kind=StateKind.BYTES,
        data=payload,
        generation=runtime.generation,
        tokens=state.tokens,
        logical_bytes=len(payload),
    )


async def restore(runtime: Runtime, payload: BackendState) -> BackendState:
    saved = await _saved(runtime, payload)
    handle = _handle(runtime)
    await handle.lane.run(handle.engine.restore, saved)  # llama.cpp must accept the bytes
    return _live(runtime, saved)


async def erase(runtime: Runtime, state: BackendState) -> None:
    """Drop what could hold ``state`` besides its snapshot (the probe's erase step)."""
    handle = _handle(runtime)

    def work() -> None:
        handle.engine.clear()
        handle.engine.sessions.clear()

    await handle.lane.run(work)
