"""Spilled states: a held state saved to a file because its slot was needed.

A prefilled state waits in its slot for its decode (a *hold*, :mod:`~werk_llamacpp.slot_allocator`).
When every state slot holds such a state and another state needs one, the least recently used
held state is saved with llama-server's own ``action=save`` into the child's private slot
directory (a *spill*) before its slot is reused. Its decode (or a prefill that continues it,
or a snapshot of it) finds it here and restores it into a slot first: with more clients than
state slots, a state costs a save and a restore instead of being lost.

Spills live as long as their hold would have (``hold_seconds``), and end when the last handoff
waiting for them has decoded. At most :data:`MAX_SPILLS` are kept per child; past that the oldest
is dropped (its decode restores from the state's disk copy when it has one, and is refused with
``reuse_unavailable`` otherwise). They are never sealed or fsynced: a restart ends the process
generation they belong to, and the child's slot directory with it.
"""

from __future__ import annotations

import contextlib
import logging
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import anyio

from werk import BackendError, WerkError

from .handle import LlamaHandle
from .slot_allocator import Hold, SlotState, allocator_for
from .slots import LlamaRefused, erase_slot, new_slot_filename, restore_slot, save_slot

__all__ = ["MAX_SPILLS", "Spill", "bring_back", "drop_all", "spilled", "take_slot"]

log = logging.getLogger("werk.llamacpp")

MAX_SPILLS = 64
"""Spilled states kept per child (each is one saved slot: its prompt's KV cells)."""


@dataclass
class Spill:
    """One spilled state: the file in the slot directory and what the save acknowledged."""

    state: SlotState
    filename: str
    n_saved: int
    n_written: int
    until: float
    holders: int


class _Spills:
    def __init__(self) -> None:
        self.by_state: OrderedDict[tuple[int, int], Spill] = OrderedDict()


_SPILLS: weakref.WeakKeyDictionary[LlamaHandle, _Spills] = weakref.WeakKeyDictionary()


def _spills(handle: LlamaHandle) -> _Spills:
    spills = _SPILLS.get(handle)
    if spills is None:
        spills = _SPILLS[handle] = _Spills()
    return spills


def spilled(handle: LlamaHandle, state: SlotState) -> Spill | None:
    """The spill of ``state``, if it was spilled and is still kept."""
    return _spills(handle).by_state.get((state.slot, state.epoch))


async def _drop(handle: LlamaHandle, spill: Spill) -> None:
    _spills(handle).by_state.pop((spill.state.slot, spill.state.epoch), None)
    path = handle.slot_dir / spill.filename
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))


async def _expire(handle: LlamaHandle) -> None:
    now = time.monotonic()
    allocator_for(handle).expire(now)
    for spill in [s for s in _spills(handle).by_state.values() if s.until <= now]:
        await _drop(handle, spill)


async def _spill(handle: LlamaHandle, hold: Hold) -> None:
    """Save the held state of ``hold`` to a spill file (the caller holds the slot lock)."""
    state = hold.state
    filename = new_slot_filename("spill")
    try:
        ack = await save_slot(handle, state.slot, filename)
        if ack.n_saved < len(state.tokens):
            raise BackendError(
                f"llama-server saved {ack.n_saved} tokens of a {len(state.tokens)}-token state"
            )
    except BaseException:
        path: Path = handle.slot_dir / filename
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))
        raise
    spills = _spills(handle)
    spills.by_state[(state.slot, state.epoch)] = Spill(
        state, filename, ack.n_saved, ack.n_written, hold.until, hold.holders
    )
    while len(spills.by_state) > MAX_SPILLS:
        oldest = next(iter(spills.by_state.values()))
        log.warning(
            "llama-server %s: more than %d states await their decode; the oldest spill is dropped",
            handle.generation,
            MAX_SPILLS,
        )
        await _drop(handle, oldest)


async def take_slot(handle: LlamaHandle) -> tuple[int, int]:
    """A state slot for a new state, ``(slot, epoch)``: a held state in it is spilled first.
    The caller holds the slot lock."""
    await _expire(handle)
    allocator = allocator_for(handle)
    slot, hold = allocator.next_slot()
    if hold is not None and allocator.current(hold.state.slot, hold.state.epoch):
        await _spill(handle, hold)
    return allocator.assign(slot)


async def bring_back(handle: LlamaHandle, spill: Spill, *, decoding: bool) -> SlotState:
    """Restore a spilled state into a slot and return it there (the caller, who holds the slot
    lock, evaluates in it next: a prefill holds what it makes, a decode needs no hold).

    ``decoding``: the restore is for one of the handoffs waiting for the state; the spill ends
    when the last of them has been served.
    """
    allocator = allocator_for(handle)
    slot, epoch = await take_slot(handle)
    try:
        ack = await restore_slot(handle, slot, spill.filename)
        if ack.n_restored != spill.n_saved or ack.n_read != spill.n_written:
            raise BackendError(
                f"llama-server restored {ack.n_restored} tokens / {ack.n_read} bytes of a "
                f"spilled state of {spill.n_saved} / {spill.n_written}"
            )
    except BaseException:
        allocator.retire(slot)
        with anyio.CancelScope(shield=True), contextlib.suppress(WerkError, LlamaRefused):
            await erase_slot(handle, slot)
        raise
    state = SlotState(
        slot=slot, epoch=epoch, generation=handle.generation, tokens=spill.state.tokens
    )
    if decoding:
        spill.holders -= 1
        if spill.holders <= 0:
            await _drop(handle, spill)
    return state


async def drop_all(handle: LlamaHandle) -> None:
    """Delete every spill of ``handle`` (its states can no longer be decoded from them)."""
    for spill in list(_spills(handle).by_state.values()):
        await _drop(handle, spill)
