"""TEST CODE: the hook implementations of the ``testkv`` backend.

Never loaded by default; installed only by the test suite. Implemented hooks:
``werk_register_backends``, ``werk_capabilities``, ``werk_prefill``, ``werk_snapshot``,
``werk_restore``, ``werk_decode`` and ``werk_openai``. ``werk_move_experts`` is deliberately
missing, so the host's "unsupported, naming ``runtime.experts.residency``" path is exercised.

State forms: prefill and restore return ``handle`` states carrying a :class:`~.kvstate.KVState`;
snapshot writes the encoded state to a new file in the runtime's private directory (fsynced,
atomically renamed) and returns a ``file`` state the host then moves into its catalog; restore
reads a ``file`` or ``bytes`` payload. ``reuse_from`` may be any of ``handle``, ``file`` or
``bytes``; ``cached_tokens`` is the length of the common token prefix it shares with the new
prompt (0 without ``reuse_from``). A state from another runtime (generation, model, weights or
layout differ) raises :class:`werk.IncompatibleState`; a malformed payload
:class:`werk.BackendError`; a dead runtime :class:`werk.Unavailable`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio

from werk import (
    BackendDescriptor,
    BackendError,
    BackendState,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DecodeCall,
    DecodeOutcome,
    OpenAICall,
    OpenAIReply,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    RuntimeEnded,
    StateKind,
    hookimpl,
)

from . import kvstate
from .decoder import FAIL_PREFILL, FAILURE_DETAIL, Generation, generate
from .engine import BACKEND, CACHE_LAYOUT, Engine, ended_file, engine_of, start, stop
from .kvstate import KVState, common_prefix, render_messages
from .openai_compat import completion_body, parse_request, stream_chunks

SLOW_CAPABILITIES = "<<slow-capabilities>>"
SLOW_STREAM = "<<slow-stream>>"
SLOW_CAPABILITIES_SECONDS = 2.0

__all__ = [
    "BACKEND",
    "CACHE_LAYOUT",
    "werk_capabilities",
    "werk_decode",
    "werk_openai",
    "werk_prefill",
    "werk_register_backends",
    "werk_restore",
    "werk_snapshot",
]

_LIVE_ROWS: tuple[tuple[CapabilityId, tuple[str, ...]], ...] = (
    (CapabilityId.STATE_PREFIX_CACHE, ("prefill",)),
    (CapabilityId.STATE_PERSISTENCE, ("prefill", "snapshot")),
    (CapabilityId.STATE_RESTORE, ("restore",)),
    (CapabilityId.STATE_TIER_DISK, ("tier",)),
    (CapabilityId.PD_PREFILL, ("prefill",)),
    (CapabilityId.PD_DECODE, ("decode",)),
    (CapabilityId.PD_HANDOFF, ("prefill", "decode")),
)
"""Rows that are ``experimental`` with a live runtime and ``unavailable`` without one."""


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    """Offer the ``testkv`` backend (format ``testkv``) with in-process start/stop."""
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("testkv",),
            description="TEST CODE: in-process backend with real opaque KV states (tests only)",
            start=start,
            stop=stop,
        )
    )


def _is_live(runtime: Runtime | None) -> bool:
    if runtime is None or not runtime.alive or not isinstance(runtime.handle, Engine):
        return False
    if not runtime.handle.poll():
        runtime.alive = False
    return runtime.alive


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    """Rows for ``testkv``; the state and P/D rows follow the runtime's liveness right now.

    A model file containing ``<<slow-capabilities>>`` makes this hook block for
    :data:`SLOW_CAPABILITIES_SECONDS` (the host must not run it on its event loop)."""
    if context.model is not None and context.model.files:
        with contextlib.suppress(OSError):
            if SLOW_CAPABILITIES in context.model.files[0].read_text(errors="replace"):
                time.sleep(SLOW_CAPABILITIES_SECONDS)
    rows = [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load", "unload"],
        )
    ]
    runtime = context.runtime
    if runtime is not None and _is_live(runtime):
        status, reason = (
            CapabilityStatus.EXPERIMENTAL,
            f"testkv runtime generation {runtime.generation} is live",
        )
    else:
        status, reason = CapabilityStatus.UNAVAILABLE, "no live testkv runtime"
    rows.extend(
        CapabilityReport(id=cap, status=status, operations=list(ops), reason=reason)
        for cap, ops in _LIVE_ROWS
    )
    rows.extend(
        [
            CapabilityReport(
                id=CapabilityId.STATE_RESTORE_CROSS_RESTART,
                status=CapabilityStatus.UNAVAILABLE,
                reason="testkv states are bound to one in-process runtime generation",
            ),
            CapabilityReport(
                id=CapabilityId.STATE_TIER_RAM,
                status=CapabilityStatus.UNSUPPORTED,
                reason="testkv keeps live states only inside its runtime",
            ),
            CapabilityReport(
                id=CapabilityId.STATE_TIER_VRAM,
                status=CapabilityStatus.UNSUPPORTED,
                reason="testkv has no accelerator memory",
            ),
            CapabilityReport(
                id=CapabilityId.EXPERTS_RESIDENCY,
                status=CapabilityStatus.UNSUPPORTED,
                reason="testkv models have no experts",
            ),
        ]
    )
    return rows


# -- state forms ---------------------------------------------------------------------------


def _handle_state(state: KVState) -> BackendState:
    return BackendState(
        kind=StateKind.HANDLE,
        handle=state,
        generation=state.generation,
        logical_bytes=state.encoded_size,
        tokens=len(state.tokens),
    )


def _check(engine: Engine, state: KVState) -> KVState:
    state.check_compatible(
        generation=engine.generation,
        model_identity=engine.model.identity,
        weights=engine.weights.digest,
        cache_layout=CACHE_LAYOUT,
    )
    return state


def _read_payload(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        raise BackendError("testkv state payload file cannot be opened") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(kvstate.MAX_STATE_BYTES + 1)
    return data


async def _load(engine: Engine, state: BackendState) -> KVState:
    """The verified :class:`KVState` of a ``handle``, ``bytes`` or ``file`` state."""
    if state.kind is StateKind.HANDLE:
        if not isinstance(state.handle, KVState):
            raise BackendError("handle state was not produced by testkv")
        return _check(engine, state.handle)
    if state.kind is StateKind.BYTES and state.data is not None:
        return _check(engine, kvstate.parse(state.data))
    if state.kind is StateKind.FILE and state.path is not None:
        data = await anyio.to_thread.run_sync(_read_payload, state.path)
        return _check(engine, kvstate.parse(data))
    raise BackendError(f"testkv cannot load a {state.kind} state")


# -- operations ----------------------------------------------------------------------------


def _prompt_text(call: PrefillCall) -> str:
    if call.prompt is not None:
        return call.prompt
    return render_messages((m.role, m.content) for m in call.messages or ())


@hookimpl
async def werk_prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    """Evaluate the prompt; report the tokens reused from ``call.reuse_from``."""
    engine = engine_of(runtime)
    text = _prompt_text(call)
    if FAIL_PREFILL in text:
        raise RuntimeError(f"testkv: simulated prefill failure {FAILURE_DETAIL}")
    tokens = text.encode("utf-8")
    cached = 0
    if call.reuse_from is not None:
        previous = await _load(engine, call.reuse_from)
        cached = common_prefix(previous.tokens, tokens)
    state = KVState(
        generation=engine.generation,
        model_identity=engine.model.identity,
        weights=engine.weights.digest,
        cache_layout=CACHE_LAYOUT,
        tokens=tokens,
    )
    return PrefillOutcome(
        state=_handle_state(state), prompt_tokens=len(tokens), cached_tokens=cached
    )


def _write_snapshot(directory: Path, data: bytes) -> Path:
    """Write ``data`` to a new file in ``directory``: temp file, fsync, rename, fsync dir."""
    final = directory / f"kv_{secrets.token_hex(12)}.testkv"
    tmp = directory / f".{final.name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return final


@hookimpl
async def werk_snapshot(runtime: Runtime, state: BackendState) -> BackendState:
    """Export a live ``handle`` state as a ``file`` payload in the runtime's private directory."""
    engine = engine_of(runtime)
    if state.kind is not StateKind.HANDLE:
        raise BackendError(f"testkv snapshots live handle states, not {state.kind} states")
    live = await _load(engine, state)
    data = live.encode()
    path = await anyio.to_thread.run_sync(_write_snapshot, engine.state_dir, data)
    return BackendState(
        kind=StateKind.FILE,
        path=path,
        generation=live.generation,
        logical_bytes=len(data),
        tokens=len(live.tokens),
    )


@hookimpl
async def werk_restore(runtime: Runtime, payload: BackendState) -> BackendState:
    """Load a ``file`` or ``bytes`` payload back as a live ``handle`` state."""
    engine = engine_of(runtime)
    if payload.kind not in (StateKind.FILE, StateKind.BYTES):
        raise BackendError(f"testkv restores file or bytes payloads, not {payload.kind} states")
    return _handle_state(await _load(engine, payload))


def _complete(engine: Engine, tokens: bytes, max_tokens: int, stop: tuple[str, ...]) -> Generation:
    return generate(
        weights_digest=engine.weights.digest,
        vocab=engine.weights.vocab,
        tokens=tokens,
        max_tokens=max_tokens,
        stop=stop,
    )


@hookimpl
async def werk_decode(runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
    """Generate the deterministic continuation of a live ``handle`` state."""
    engine = engine_of(runtime)
    if call.state.kind is not StateKind.HANDLE:
        raise BackendError(f"testkv decodes live handle states, not {call.state.kind} states")
    live = await _load(engine, call.state)
    out = _complete(engine, live.tokens, call.max_tokens, tuple(call.stop))
    return DecodeOutcome(
        text=out.text, finish_reason=out.finish_reason, completion_tokens=out.completion_tokens
    )


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    """Answer ``/v1`` chat and text completions with the same decoder as ``werk_decode``."""
    engine = engine_of(runtime)
    ended = ended_file(engine.model_file)
    if ended.exists():  # the runtime "ended" before this request reached it
        ended.unlink(missing_ok=True)
        engine.kill()
        runtime.alive = False
        raise RuntimeEnded(f"testkv runtime {runtime.generation} ended before the request")
    request = parse_request(call.route, call.body, runtime.model.id)
    if FAIL_PREFILL in request.text:
        raise RuntimeError(f"testkv: simulated prefill failure {FAILURE_DETAIL}")
    tokens = request.text.encode("utf-8")

    def complete() -> Generation:
        return _complete(engine, tokens, request.max_tokens, request.stop)

    if not call.stream:
        body = completion_body(
            request, complete(), prompt_tokens=len(tokens), fingerprint=runtime.generation
        )
        return OpenAIReply(body=body)
    stream = stream_chunks(
        request,
        prompt_tokens=len(tokens),
        fingerprint=runtime.generation,
        complete=complete,
        check_alive=lambda: engine_of(runtime),
    )
    if SLOW_STREAM in request.text and runtime.model.files:
        stream = _Observed(stream, closed_marker(runtime.model.files[0]))
    return OpenAIReply(stream=stream)


def closed_marker(model_file: Path) -> Path:
    """Created when a ``<<slow-stream>>`` reply's generator was closed (``aclose`` ran)."""
    return model_file.with_name(model_file.name + ".stream-closed")


class _Observed:
    """Relays ``stream`` slowly (0.5 s before each chunk after the first) and records in
    ``marker`` that :meth:`aclose` was called. A class, not a generator, like a plugin's stream
    that holds a resource (a slot, an upstream response): a cancelled ``__anext__`` cleans
    nothing up, so only the host's ``aclose()`` frees it."""

    def __init__(self, stream: AsyncIterator[bytes], marker: Path) -> None:
        self._stream = stream
        self._marker = marker
        self._first = True

    def __aiter__(self) -> _Observed:
        return self

    async def __anext__(self) -> bytes:
        if not self._first:
            await anyio.sleep(0.5)
        self._first = False
        return await self._stream.__anext__()

    async def aclose(self) -> None:
        self._marker.write_text("closed\n")
        aclose = getattr(self._stream, "aclose", None)
        if aclose is not None:
            await aclose()
