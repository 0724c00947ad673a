"""Named states on a managed llama-server: prefill, snapshot, restore and decode.

The four operation hooks of the llama.cpp backend, wired by ``plugin.py``. All of them hold
``handle.slot_lock`` while they touch a state slot (waiting in line for it, at most
``state_wait_seconds``, then ``resource_exhausted``), so slot allocation, ``/slots`` actions and
slot-bound completions never interleave on one child.

**Live states** are ``BackendState(kind=handle)`` whose ``handle`` is a
:class:`~werk_llamacpp.slots.SlotState` (slot id, slot epoch, generation, prompt tokens). A
prefilled (or restored) state is *held* for its decode: when its slot is needed by another
state first, it is spilled to a file and restored for its decode
(:mod:`~werk_llamacpp.spills`); after ``state_hold_seconds`` the hold ends. A state whose slot
was since given to another state (the epoch moved on) and that has no spill is *stale*: its
decode restores it from its disk copy when the host offers one (``DecodeCall.restore``) and is
refused with ``reuse_unavailable`` otherwise, never silently re-prefilled.

**Prefill** runs the functional probe first when this generation has not run it (the host lets an
opted-in Prefill through while the capability is still ``unavailable``) and refuses with
``unavailable`` when it failed. Messages are rendered by the child's own chat template
(``/apply-template``), then tokenized by the child. The prompt is evaluated with ``/completion``
(``cache_prompt: true``, ``id_slot``, ``n_predict: 0``): a new state gets an erased slot, so its
``cached_tokens`` is 0; with ``reuse_from`` the prompt continues in that state's slot and
``cached_tokens`` is the server's own ``timings.cache_n``. A stale ``reuse_from`` raises
``reuse_unavailable`` under ``reuse: required``; under ``prefer`` the prompt is evaluated afresh in
a new slot and ``cached_tokens`` reports the (absent) reuse truthfully. A Prefill that continues a
state **just restored** (nothing evaluated in its slot since the restore) with exactly its tokens
evaluates nothing: the server's restore acknowledged the whole prompt (``n_restored``, checked
against the snapshot), which is the ``cached_tokens`` reported, and the Decode computes the last
prompt token as it always does (the server recomputes at least one token to have logits);
evaluating it in the Prefill too would compute the same token twice (one forward pass). The
evaluation's reuse is then observed where the text is made: the Decode's ``timings.cache_n``
check below. A Prefill no decode follows (``PrefillCall.decode`` false: the host only keeps
the state) holds its slot only until its snapshot (60 s at most without one).

**Snapshot** saves the slot under a Werk-generated name in the private slot directory and seals
the file: the server's bytes (exactly ``n_written`` of them), then a JSON trailer (format,
generation, ``n_saved``, ``n_written``, the prompt tokens, the process's lineage), its length
and a magic. The file is
fsynced (the server does not) and handed to the host as a ``file`` payload.

**Restore** moves (or copies) the host's scratch file into the slot directory under a fresh name,
checks the trailer (a payload of another generation is ``incompatible_state`` unless this
generation's probe proved cross-restart restore and the payload's lineage is this process's;
a restore that comes before the generation's first prefill runs the probe first), cuts the file
back to the server's bytes, restores it into an idle state slot and requires the acknowledged
``n_restored``/``n_read`` to equal the recorded ``n_saved``/``n_written``. Any failure erases that
slot before anyone else can use it.

**Decode** (streamed to ``DecodeCall.on_text`` when the host asks) resends the state's prompt
tokens to its slot with the sampling parameters and requires
``timings.cache_n >= tokens - 1``: the prefix came from the slot. Otherwise the server has just
recomputed the prompt, and decode fails (``backend_error``) instead of returning that text. With
``DecodeCall.continues`` the slot (prompt and reply) stays held for the prefill that keeps the
reply (``DecodeOutcome.after``), which takes the hold over; its snapshot ends it.
llama.cpp seeds are 32-bit: a larger seed is reduced modulo ``2**32 - 1``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import anyio

from werk import (
    BackendError,
    BackendState,
    CapabilityId,
    DecodeCall,
    DecodeOutcome,
    FinishReason,
    IncompatibleState,
    InvalidRequest,
    PrefillCall,
    PrefillOutcome,
    Reuse,
    ReuseUnavailable,
    Runtime,
    StateKind,
    Unavailable,
    WerkError,
    storage_refusal,
)

from .handle import LlamaHandle, ProbeStatus
from .probe import run_probe
from .slot_allocator import slot_lock
from .slots import (
    LlamaRefused,
    SlotState,
    allocator_for,
    complete_in_slot,
    erase_slot,
    new_slot_filename,
    render_messages,
    restore_slot,
    save_slot,
    slot_is_idle,
    tokenize,
)
from .snapshot_file import PAYLOAD_FORMAT, PayloadMeta, adopt, seal
from .spills import bring_back, spilled, take_slot

__all__ = ["PAYLOAD_FORMAT", "decode", "prefill", "restore", "snapshot"]

_NOT_RESIDENT = "the state was not resident; refusing to re-prefill silently"
_SNAPSHOT_HOLD = 60.0
"""Seconds a state prefilled without a decode to follow (``PrefillCall.decode`` false) keeps
its slot for the host's snapshot."""


# -- shared checks -----------------------------------------------------------------------------


def _handle_of(runtime: Runtime) -> LlamaHandle:
    handle = runtime.handle
    if not isinstance(handle, LlamaHandle) or not runtime.alive:
        raise Unavailable("the llama-server process is not running", retryable=True)
    return handle


def _require_probe(handle: LlamaHandle, capability: CapabilityId) -> None:
    if handle.probe.status is not ProbeStatus.PASSED:
        raise Unavailable(
            f"{capability} is unavailable: {handle.probe.reason}", capability=capability
        )


def _slot_state(handle: LlamaHandle, state: BackendState) -> SlotState:
    """The live :class:`SlotState` of ``state``, checked against this generation."""
    live = state.handle if state.kind is StateKind.HANDLE else None
    if not isinstance(live, SlotState):
        raise BackendError("this is not a live llama.cpp state")
    if live.generation != handle.generation or state.generation != handle.generation:
        raise IncompatibleState("the state belongs to another llama-server process generation")
    return live


def _live(
    handle: LlamaHandle,
    slot: int,
    epoch: int,
    tokens: tuple[int, ...],
    *,
    until_snapshot: bool = False,
    restored: bool = False,
) -> BackendState:
    return BackendState(
        kind=StateKind.HANDLE,
        handle=SlotState(
            slot=slot,
            epoch=epoch,
            generation=handle.generation,
            tokens=tokens,
            restored=restored,
            until_snapshot=until_snapshot,
        ),
        generation=handle.generation,
        tokens=len(tokens),
    )


async def _discard(handle: LlamaHandle, slot: int, error: BaseException) -> None:
    """Erase ``slot`` (shielded, best effort) and stale whatever state it held, unless ``error``
    is a refusal that left the slot untouched (a prompt that does not fit its context)."""
    if isinstance(error, InvalidRequest):
        return
    with anyio.CancelScope(shield=True):
        allocator_for(handle).retire(slot)
        with contextlib.suppress(WerkError, LlamaRefused):
            await erase_slot(handle, slot)


async def _unlink(path: Path) -> None:
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))


# -- prefill -----------------------------------------------------------------------------------


async def prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    """Evaluate the prompt in a state slot; see the module docstring."""
    handle = _handle_of(runtime)
    async with slot_lock(handle):
        if handle.probe.status is ProbeStatus.NOT_RUN:
            handle.probe = await run_probe(handle)
        _require_probe(handle, CapabilityId.PD_PREFILL)
        if call.prompt is not None:
            text = call.prompt
        elif call.messages is not None:
            text = await render_messages(handle, call.messages)
        else:
            raise InvalidRequest("a prefill needs a prompt or messages")
        tokens = await tokenize(handle, text)
        allocator = allocator_for(handle)
        target: tuple[int, int] | None = None
        if call.reuse_from is not None:
            target = await _reuse_target(handle, call)
        restored, handle.restored_slot = handle.restored_slot, None
        if target is not None and _restored_whole(handle, restored, target, call, tokens):
            allocator.touch(target[0])
            live = _live(handle, *target, tokens, until_snapshot=not call.decode)
            _hold(handle, call, live, inherited=_inherits_hold(handle, call, target))
            return PrefillOutcome(
                state=live,
                prompt_tokens=len(tokens),
                cached_tokens=len(tokens),
                restored_tokens=restored[2] if restored is not None else None,
            )
        fresh = target is None
        if target is None:
            target = await take_slot(handle)
        slot, epoch = target
        try:
            if fresh:
                await erase_slot(handle, slot)
            answer = await complete_in_slot(handle, slot, tokens, n_predict=0)
        except BaseException as exc:
            await _discard(handle, slot, exc)
            raise
        allocator.touch(slot)
        live = _live(handle, slot, epoch, tokens, until_snapshot=not call.decode)
        _hold(handle, call, live, inherited=not fresh and _inherits_hold(handle, call, target))
    return PrefillOutcome(
        state=live,
        prompt_tokens=len(tokens),
        cached_tokens=answer.timings.cache_n,
        restored_tokens=restored[2] if restored is not None and restored[:2] == target else None,
    )


def _hold(handle: LlamaHandle, call: PrefillCall, live: BackendState, *, inherited: bool) -> None:
    """Keep a prefilled state for its decode — or, when none follows (``call.decode`` false),
    until its snapshot, which releases it. A state that continued a restore held for it takes
    that hold over instead."""
    state = _slot_state(handle, live)
    allocator = allocator_for(handle)
    if inherited and allocator.held(state.slot):
        return
    seconds = handle.hold_seconds if call.decode else min(handle.hold_seconds, _SNAPSHOT_HOLD)
    allocator.hold(state, seconds)


def _inherits_hold(handle: LlamaHandle, call: PrefillCall, target: tuple[int, int]) -> bool:
    """Whether the prefill continued, in its own slot, a state ``werk_restore`` placed and held
    for it: that hold becomes this state's (its decode releases it)."""
    reuse_from = call.reuse_from
    if reuse_from is None or reuse_from.kind is not StateKind.HANDLE:
        return False
    live = _slot_state(handle, reuse_from)
    return live.restored and (live.slot, live.epoch) == target


def _restored_whole(
    handle: LlamaHandle,
    restored: tuple[int, int, int] | None,
    target: tuple[int, int],
    call: PrefillCall,
    tokens: tuple[int, ...],
) -> bool:
    """Whether ``target`` is the slot of the last restore, nothing evaluated there since, and
    the restored state's tokens are exactly the prompt's (the restore acknowledged them all)."""
    if restored is None or restored[:2] != target or restored[2] < len(tokens):
        return False
    reuse_from = call.reuse_from
    if reuse_from is None or reuse_from.kind is not StateKind.HANDLE:
        return False
    return _slot_state(handle, reuse_from).tokens == tokens


async def _reuse_target(handle: LlamaHandle, call: PrefillCall) -> tuple[int, int] | None:
    """The ``(slot, epoch)`` to continue in, or ``None`` to evaluate afresh (``prefer``)."""
    reuse_from = call.reuse_from
    assert reuse_from is not None
    if reuse_from.kind in (StateKind.FILE, StateKind.BYTES):
        restored = await _restore_locked(handle, reuse_from)
        live = _slot_state(handle, restored)
        return live.slot, live.epoch
    live = _slot_state(handle, reuse_from)
    if allocator_for(handle).current(live.slot, live.epoch):
        return live.slot, live.epoch
    spill = spilled(handle, live)
    if spill is not None:  # held for a decode when its slot was needed: back from its file
        # A restored state's spill stood for the hold of this very prefill: it ends here.
        back = await bring_back(handle, spill, decoding=live.restored)
        return back.slot, back.epoch
    if call.policy.reuse is Reuse.REQUIRED:
        raise ReuseUnavailable(
            "the reusable state is no longer resident in llama-server (its slot was reassigned)"
        )
    return None


# -- snapshot ----------------------------------------------------------------------------------


async def snapshot(runtime: Runtime, state: BackendState) -> BackendState:
    """Save a live state's slot as a sealed, fsynced ``file`` payload; see the module docstring."""
    handle = _handle_of(runtime)
    live = _slot_state(handle, state)
    async with slot_lock(handle):
        _require_probe(handle, CapabilityId.STATE_PERSISTENCE)
        allocator = allocator_for(handle)
        if not allocator.current(live.slot, live.epoch):
            spill = spilled(handle, live)
            if spill is None:
                raise BackendError(
                    "the state is no longer resident in llama-server; cannot save it"
                )
            live = await bring_back(handle, spill, decoding=False)
        filename = new_slot_filename("snapshot")
        path = handle.slot_dir / filename
        try:
            ack = await save_slot(handle, live.slot, filename)
            if ack.n_saved < len(live.tokens):  # (a short file is checked when sealing)
                raise BackendError(
                    f"llama-server saved {ack.n_saved} tokens of a {len(live.tokens)}-token state"
                )
            meta = PayloadMeta(
                format=PAYLOAD_FORMAT,
                generation=handle.generation,
                n_saved=ack.n_saved,
                n_written=ack.n_written,
                tokens=list(live.tokens),
                lineage=handle.lineage,
            )
            try:
                await anyio.to_thread.run_sync(lambda: seal(path, meta))
            except OSError as exc:
                refusal = storage_refusal(exc, "seal a state's slot file")
                raise refusal or BackendError(
                    f"the slot file could not be sealed ({exc.strerror})"
                ) from None
        except BaseException:
            await _unlink(path)
            raise
        allocator.touch(live.slot)
        if live.until_snapshot:  # no decode follows: the slot is free for the next state
            allocator.release(live.slot, live.epoch)
    return BackendState(
        kind=StateKind.FILE,
        path=path,
        generation=handle.generation,
        logical_bytes=ack.n_written,
        tokens=ack.n_saved,
    )


# -- restore -----------------------------------------------------------------------------------


async def restore(runtime: Runtime, payload: BackendState) -> BackendState:
    """Load a sealed snapshot into an idle state slot; see the module docstring."""
    handle = _handle_of(runtime)
    async with slot_lock(handle):
        restored = await _restore_locked(handle, payload)
        allocator_for(handle).hold(_slot_state(handle, restored), handle.hold_seconds)
        return restored  # held for the prefill that continues it, which takes the hold over


async def _restore_locked(handle: LlamaHandle, payload: BackendState) -> BackendState:
    if handle.probe.status is ProbeStatus.NOT_RUN:  # a restart's first reuse: prove it first
        handle.probe = await run_probe(handle)
    _require_probe(handle, CapabilityId.STATE_RESTORE)
    if payload.kind not in (StateKind.FILE, StateKind.BYTES):
        raise BackendError("a llama.cpp restore needs a file or bytes payload")
    filename = new_slot_filename("restore")
    dest = handle.slot_dir / filename
    try:
        try:
            meta = await anyio.to_thread.run_sync(lambda: adopt(payload, dest))
        except OSError as exc:
            raise BackendError(f"the snapshot payload could not be read ({exc.strerror})") from None
        if meta.generation != handle.generation:
            _require_cross_restart(handle, meta)
        allocator = allocator_for(handle)
        slot, epoch = await take_slot(handle)
        try:
            if not await slot_is_idle(handle, slot):
                raise BackendError(f"state slot {slot} is busy; refusing to restore into it")
            ack = await restore_slot(handle, slot, filename)
            if ack.n_restored != meta.n_saved or ack.n_read != meta.n_written:
                raise BackendError(
                    f"llama-server restored {ack.n_restored} tokens / {ack.n_read} bytes, "
                    f"the snapshot holds {meta.n_saved} / {meta.n_written}"
                )
        except BaseException as exc:
            await _discard(handle, slot, exc)
            raise
        allocator.touch(slot)
        handle.restored_slot = (slot, epoch, ack.n_restored)
    finally:
        await _unlink(dest)
    tokens = tuple(meta.tokens)
    return BackendState(
        kind=StateKind.HANDLE,
        handle=SlotState(
            slot=slot, epoch=epoch, generation=handle.generation, tokens=tokens, restored=True
        ),
        generation=handle.generation,
        tokens=len(tokens),
        logical_bytes=meta.n_written,
    )


def _require_cross_restart(handle: LlamaHandle, meta: PayloadMeta) -> None:
    """A snapshot of an earlier generation restores only into a generation that proved
    cross-restart restore, and only when it was made by a process of the same lineage."""
    if handle.cross_restart.status is not ProbeStatus.PASSED:
        raise IncompatibleState(
            f"the snapshot was made by llama-server process generation {meta.generation}; "
            f"cross-restart restore is not proven for generation {handle.generation}: "
            f"{handle.cross_restart.reason}",
            capability=CapabilityId.STATE_RESTORE_CROSS_RESTART,
        )
    if not meta.lineage or meta.lineage != handle.lineage:
        raise IncompatibleState(
            f"the snapshot was made by llama-server process generation {meta.generation}, "
            "started differently (executable, model, arguments or slot layout)",
            capability=CapabilityId.STATE_RESTORE_CROSS_RESTART,
        )


# -- decode ------------------------------------------------------------------------------------


async def _restore_for_decode(handle: LlamaHandle, call: DecodeCall, live: SlotState) -> SlotState:
    """The state back in a slot from its spill or its disk copy, or ``reuse_unavailable`` when
    it has neither. The caller holds the slot lock, so nothing takes the restored slot before
    the decode runs."""
    spill = spilled(handle, live)
    if spill is not None:
        return await bring_back(handle, spill, decoding=True)
    if call.restore is None:
        raise ReuseUnavailable(
            f"{_NOT_RESIDENT}: its slot was given to another state or emptied, and it has no "
            f"spill or disk copy (a state is kept for its decode for {handle.hold_seconds:g} s): "
            "prefill again"
        )
    payload = await call.restore()
    restored = _slot_state(handle, await _restore_locked(handle, payload))
    if restored.tokens != live.tokens:
        allocator_for(handle).retire(restored.slot)
        with anyio.CancelScope(shield=True), contextlib.suppress(WerkError, LlamaRefused):
            await erase_slot(handle, restored.slot)
        raise BackendError("the state's disk copy holds other tokens than its handoff")
    return restored


_FINISH = {"limit": FinishReason.LENGTH, "eos": FinishReason.STOP, "word": FinishReason.STOP}


async def decode(runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
    """Continue from a live state's slot; see the module docstring."""
    handle = _handle_of(runtime)
    live = _slot_state(handle, call.state)
    if call.max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1")
    seed = None if call.seed is None else call.seed % (2**32 - 1)
    async with slot_lock(handle):
        _require_probe(handle, CapabilityId.PD_DECODE)
        allocator = allocator_for(handle)
        if not allocator.current(live.slot, live.epoch):
            live = await _restore_for_decode(handle, call, live)
        handle.restored_slot = None  # the slot evaluates now
        try:
            try:
                answer = await complete_in_slot(
                    handle,
                    live.slot,
                    live.tokens,
                    n_predict=call.max_tokens,
                    temperature=call.temperature,
                    seed=seed,
                    stop=call.stop,
                    on_text=call.on_text,
                )
            except BaseException as exc:
                await _discard(handle, live.slot, exc)
                raise
            if answer.timings.cache_n < len(live.tokens) - 1:
                allocator.retire(live.slot)
                raise BackendError(
                    f"{_NOT_RESIDENT} (llama-server reused {answer.timings.cache_n} of "
                    f"{len(live.tokens)} prompt tokens)"
                )
            allocator.touch(live.slot)
        finally:
            allocator.release(live.slot, live.epoch)
        after = _kept_for_continuation(handle, live) if call.continues else None
    finish = FinishReason.LENGTH if answer.truncated else _FINISH.get(answer.stop_type)
    if finish is None:
        raise BackendError(
            f"llama-server stopped decoding for an unknown reason ({answer.stop_type})"
        )
    return DecodeOutcome(
        text=answer.content,
        finish_reason=finish,
        completion_tokens=answer.timings.predicted_n,
        after=after,
    )


def _kept_for_continuation(handle: LlamaHandle, live: SlotState) -> BackendState:
    """The decoded state, held (briefly) for the prefill that continues it with the reply —
    which takes the hold over, as after a restore — so that a state waiting for the slot spills
    it instead of taking it. Its slot holds the prompt and the generated tokens; llama-server
    finds what the continuing prompt shares with them."""
    kept = _live(handle, live.slot, live.epoch, live.tokens, restored=True)
    allocator_for(handle).hold(_slot_state(handle, kept), min(handle.hold_seconds, _SNAPSHOT_HOLD))
    return kept
