"""The state-slot bookkeeping (:mod:`werk_llamacpp.slot_allocator`): which slot a new state
gets, what holds protect, and the bounded wait for the slot lock. Pure bookkeeping, no child;
the real llama-server behaviour is in ``test_llamacpp_states.py`` and
``test_llamacpp_states_concurrent.py``."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from werk_llamacpp.handle import LlamaHandle
from werk_llamacpp.slot_allocator import SlotAllocator, SlotState, slot_lock

from werk import LoopbackClient, ResourceExhausted

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _state(allocator: SlotAllocator, slot: int, epoch: int) -> SlotState:
    return SlotState(slot=slot, epoch=epoch, generation="g_test", tokens=(1, 2, 3))


def test_free_slots_first_then_the_least_recently_used_unheld_one() -> None:
    allocator = SlotAllocator((3, 4))
    a = allocator.acquire()
    b = allocator.acquire()
    assert {a[0], b[0]} == {3, 4}
    allocator.touch(a[0])  # b is now the least recently used
    slot, hold = allocator.next_slot()
    assert slot == b[0] and hold is None
    allocator.hold(_state(allocator, *b), 60)
    slot, hold = allocator.next_slot()
    assert slot == a[0] and hold is None  # an unheld slot goes before a held one


def test_a_held_state_is_named_when_every_slot_is_held() -> None:
    allocator = SlotAllocator((3,))
    slot, epoch = allocator.acquire()
    state = _state(allocator, slot, epoch)
    allocator.hold(state, 60)
    picked, hold = allocator.next_slot()
    assert picked == slot and hold is not None and hold.state == state
    allocator.assign(picked)
    assert not allocator.current(slot, epoch) and not allocator.held(slot)


def test_holds_count_their_handoffs_and_expire() -> None:
    allocator = SlotAllocator((3,))
    slot, epoch = allocator.acquire()
    state = _state(allocator, slot, epoch)
    now = time.monotonic()
    allocator.hold(state, 10, now=now)
    allocator.hold(state, 20, now=now)  # a second handoff continues the same state
    allocator.release(slot, epoch)
    assert allocator.held(slot)
    allocator.release(slot, epoch)
    assert not allocator.held(slot)
    allocator.hold(state, 10, now=now)
    allocator.expire(now + 9)
    assert allocator.held(slot)
    allocator.expire(now + 10)
    assert not allocator.held(slot) and allocator.current(slot, epoch)  # kept, not protected


def test_a_stale_state_cannot_be_held_or_released_into_a_newer_one() -> None:
    allocator = SlotAllocator((3,))
    slot, old = allocator.acquire()
    _, new = allocator.assign(slot)
    allocator.hold(_state(allocator, slot, old), 60)
    assert not allocator.held(slot)
    allocator.hold(_state(allocator, slot, new), 60)
    allocator.release(slot, old)
    assert allocator.held(slot)
    allocator.retire(slot)
    assert not allocator.held(slot) and not allocator.current(slot, new)


def _handle(tmp_path: Path, wait: float) -> LlamaHandle:
    return LlamaHandle(
        base_url="http://127.0.0.1:9",
        api_key="k",
        http=LoopbackClient("127.0.0.1", 9),
        pid=0,
        generation="g_test",
        slot_dir=tmp_path,
        total_slots=2,
        state_slots=(1,),
        help_text="",
        args=(),
        log_path=tmp_path / "log",
        wait_seconds=wait,
    )


async def test_the_slot_lock_is_first_come_first_served_and_bounded(tmp_path: Path) -> None:
    handle = _handle(tmp_path, wait=0.3)
    order: list[int] = []
    refused: list[ResourceExhausted] = []

    async def request(index: int, work: float) -> None:
        try:
            async with slot_lock(handle):
                order.append(index)
                await anyio.sleep(work)
        except ResourceExhausted as exc:
            refused.append(exc)

    async with anyio.create_task_group() as group:
        for index in range(3):
            group.start_soon(request, index, 0.1)
            await anyio.sleep(0.01)
    assert order == [0, 1, 2] and not refused  # 0.2 s of waiting is inside the bound

    async with anyio.create_task_group() as group:
        group.start_soon(request, 10, 1.0)
        await anyio.sleep(0.01)
        group.start_soon(request, 11, 0.0)
    assert order[-1] == 10 and len(refused) == 1
    assert refused[0].retryable and refused[0].retry_after == 1  # nobody else was in line
    assert not handle.slot_lock.locked()
