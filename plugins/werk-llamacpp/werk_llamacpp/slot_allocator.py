"""Who owns which state slot of one llama-server child, and what is kept for a decode.

A live named state is a :class:`SlotState`: a slot id plus the slot's *epoch*. The
:class:`SlotAllocator` bumps a slot's epoch every time the slot is (re)assigned or its content
is discarded, so a handle whose slot was taken by a newer state is recognisably stale
(:meth:`SlotAllocator.current`). Callers hold ``handle.slot_lock`` for every allocation and
every request that touches a state slot (:func:`slot_lock`: first come, first served, bounded).

**Holds.** A state that was just prefilled (or restored) is *held* until its decode has run or
``hold_seconds`` passed (a handoff's lifetime): when its slot must go to another state, the
caller first saves it to a *spill* file (:mod:`werk_llamacpp.spills`), and its decode restores
it from there. A new state gets a free slot first, then the least recently used slot nobody
holds, and only then a held one. So concurrent clients never take each other's states away
between a prefill and its snapshot or decode; they cost a save and a restore at most.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from werk import BackendError, ResourceExhausted

from .handle import LlamaHandle

__all__ = ["Hold", "SlotAllocator", "SlotState", "allocator_for", "check_state_slot", "slot_lock"]


@dataclass(frozen=True)
class SlotState:
    """A live named state: the prompt tokens evaluated in one state slot of one child.

    :ivar slot: the state slot holding the KV cells.
    :ivar epoch: the slot's epoch when this state was made (stale once the slot moves on).
    :ivar generation: the process generation of the child.
    :ivar tokens: the prompt's token ids, resent on decode so the server matches the cached
        prefix (never shown in ``repr``: they are the prompt).
    :ivar restored: placed by ``werk_restore`` and held for the prefill that continues it
        (which takes the hold over).
    :ivar until_snapshot: prefilled with no decode to follow (``PrefillCall.decode`` false):
        its hold ends with its snapshot.
    """

    slot: int
    epoch: int
    generation: str
    tokens: tuple[int, ...] = field(repr=False)
    restored: bool = False
    until_snapshot: bool = False


@dataclass
class Hold:
    """A held state: how many handoffs wait to decode it, and until when at most."""

    state: SlotState
    until: float
    holders: int = 1


@dataclass
class SlotAllocator:
    """Epochs, recency and holds of one child's state slots (callers hold the slot lock)."""

    slots: tuple[int, ...]
    _epochs: dict[int, int] = field(default_factory=dict)
    _used: dict[int, int] = field(default_factory=dict)
    _held: dict[int, Hold] = field(default_factory=dict)
    _clock: int = 0

    def __post_init__(self) -> None:
        if not self.slots or len(set(self.slots)) != len(self.slots):
            raise ValueError("a slot allocator needs distinct state slots")
        self._epochs = {slot: 0 for slot in self.slots}

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def expire(self, now: float | None = None) -> None:
        """Drop the holds whose time is up (their states stay until their slot is needed)."""
        now = time.monotonic() if now is None else now
        for slot in [s for s, h in self._held.items() if h.until <= now]:
            del self._held[slot]

    def next_slot(self) -> tuple[int, Hold | None]:
        """The slot a new state would get, and the hold on the state in it (the caller spills
        that state first): a free slot, else the least recently used one nobody holds, else
        the least recently used held one."""
        free = [s for s in self.slots if s not in self._used]
        if free:
            return free[0], None
        unheld = [s for s in self.slots if s not in self._held]
        slot = min(unheld or self.slots, key=lambda s: self._used[s])
        return slot, self._held.get(slot)

    def assign(self, slot: int) -> tuple[int, int]:
        """Give ``slot`` to a new state: ``(slot, epoch)``. The state in it becomes stale."""
        self._held.pop(slot, None)
        self._epochs[slot] += 1
        self._used[slot] = self._tick()
        return slot, self._epochs[slot]

    def acquire(self) -> tuple[int, int]:
        """Assign :meth:`next_slot` without spilling anything (the functional probe and a
        chat's reservation, which run when no state is held or keep none)."""
        return self.assign(self.next_slot()[0])

    def current(self, slot: int, epoch: int) -> bool:
        """Whether the state made at ``epoch`` still owns ``slot``."""
        return self._epochs.get(slot) == epoch

    def touch(self, slot: int) -> None:
        if slot in self._used:
            self._used[slot] = self._tick()

    def hold(self, state: SlotState, seconds: float, *, now: float | None = None) -> None:
        """One more handoff waits to decode ``state``: keep it for up to ``seconds``."""
        if not self.current(state.slot, state.epoch):
            return
        until = (time.monotonic() if now is None else now) + seconds
        held = self._held.get(state.slot)
        if held is not None and held.state.epoch == state.epoch:
            held.holders += 1
            held.until = max(held.until, until)
        else:
            self._held[state.slot] = Hold(state, until)

    def held(self, slot: int) -> bool:
        return slot in self._held

    def release(self, slot: int, epoch: int) -> None:
        """One handoff of the state made at ``epoch`` on ``slot`` has decoded."""
        held = self._held.get(slot)
        if held is None or held.state.epoch != epoch:
            return
        held.holders -= 1
        if held.holders <= 0:
            del self._held[slot]

    def retire(self, slot: int) -> None:
        """The slot's content is gone (erased or unknown): stale its state, make it free."""
        if slot in self._epochs:
            self._epochs[slot] += 1
            self._used.pop(slot, None)
            self._held.pop(slot, None)


_ALLOCATORS: weakref.WeakKeyDictionary[LlamaHandle, SlotAllocator] = weakref.WeakKeyDictionary()


def allocator_for(handle: LlamaHandle) -> SlotAllocator:
    """The allocator of ``handle``'s state slots (one per child, created on first use)."""
    allocator = _ALLOCATORS.get(handle)
    if allocator is None:
        for slot in handle.state_slots:
            check_state_slot(handle, slot)
        allocator = SlotAllocator(tuple(handle.state_slots))
        _ALLOCATORS[handle] = allocator
    return allocator


@contextlib.asynccontextmanager
async def slot_lock(handle: LlamaHandle) -> AsyncIterator[None]:
    """Hold ``handle.slot_lock``, waiting in line (anyio's lock is first come, first served)
    for at most ``handle.wait_seconds``.

    :raises werk.ResourceExhausted: the wait ran out (retryable; ``Retry-After`` says a second
        per queued request ahead, at least one).
    """
    queued = handle.slot_lock.statistics().tasks_waiting + 1
    try:
        with anyio.fail_after(handle.wait_seconds):
            await handle.slot_lock.acquire()
    except TimeoutError:
        raise ResourceExhausted(
            f"the state slots of this llama-server were busy for {handle.wait_seconds:g} s "
            f"({queued} state requests queued)",
            retryable=True,
            retry_after=max(1, queued),
        ) from None
    try:
        yield
    finally:
        handle.slot_lock.release()


def check_state_slot(handle: LlamaHandle, slot: int) -> int:
    """``slot`` if it is one of the handle's state slots and below ``total_slots``.

    llama-server wraps out-of-range ids instead of refusing them, so an unchecked id could act
    on a slot that serves ``/v1`` traffic.
    """
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise BackendError(f"slot id {slot!r} is not an integer")
    if not 0 <= slot < handle.total_slots:
        raise BackendError(f"slot id {slot} is outside 0..{handle.total_slots - 1}")
    if slot not in handle.state_slots:
        raise BackendError(f"slot {slot} is not one of this process's state slots")
    return slot
