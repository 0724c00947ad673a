"""Volatile named states of tier ``ram`` (an in-process backend's states): their bytes are
reserved in the memory manager when kept, a state that does not fit is refused, and every way
a state leaves the index (prune, expiry, its generation ending) releases them."""

from __future__ import annotations

import pytest

from werk import BackendState, ResourceExhausted, StateKind
from werk.control.volatile import VolatileStates
from werk.memory import MemoryManager
from werk.memory.telemetry import AcceleratorSample
from werk.protocol import InvalidRequest, Tier
from werk.protocol.memory import HostMemory
from werk.state.envelope import Envelope

GiB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _manager(total: int = 10 * GiB, used: int = 1 * GiB) -> MemoryManager:
    return MemoryManager(
        host_sampler=lambda: HostMemory(
            total_bytes=total, used_bytes=used, available_bytes=total - used
        ),
        accelerator_sampler=lambda: AcceleratorSample(None, "no accelerator in this test"),
    )


def _envelope(generation: str = "g_1") -> Envelope:
    return Envelope(
        adapter="a", adapter_version="1", backend="b", executable="", model_identity="sha256:0",
        runtime_args=(), cache_layout="", generation=generation, principal="local",
    )  # fmt: skip


def _add(store: VolatileStates, nbytes: int | None, *, ttl: int | None = None, gen: str = "g_1"):  # type: ignore[no-untyped-def]
    return store.add(
        principal="local",
        envelope=_envelope(gen),
        model="m",
        backend="b",
        fingerprint="fp",
        state=BackendState(
            kind=StateKind.HANDLE, handle=object(), generation=gen, logical_bytes=nbytes
        ),
        ttl_seconds=ttl,
        pinned=False,
        tier=Tier.RAM,
    )


def _allocated(memory: MemoryManager) -> int:
    return memory.snapshot().managed.allocated_bytes


def test_a_ram_state_is_accounted_until_it_is_removed() -> None:
    memory = _manager()
    store = VolatileStates(memory=memory)
    entry = _add(store, 5000)
    assert entry.summary(reusable=True).tier is Tier.RAM
    assert _allocated(memory) == 5000
    assert store.counts() == {("ram", "ready"): 1}
    store.remove("local", entry.id)
    assert _allocated(memory) == 0


def test_expiry_and_a_dead_generation_release_the_bytes() -> None:
    memory = _manager()
    clock = Clock()
    store = VolatileStates(memory=memory, clock=clock)
    _add(store, 1000, ttl=10)
    _add(store, 2000, gen="g_2")
    assert _allocated(memory) == 3000
    clock.now += 11
    store.purge_expired()
    assert _allocated(memory) == 2000
    assert store.drop_generations(frozenset({"g_1"})) == 1
    assert _allocated(memory) == 0


def test_a_ram_state_that_does_not_fit_is_refused_and_a_size_is_required() -> None:
    memory = _manager(total=10 * GiB, used=9 * GiB)
    store = VolatileStates(memory=memory)
    with pytest.raises(ResourceExhausted):
        _add(store, 2 * GiB)
    with pytest.raises(InvalidRequest, match="logical_bytes"):
        _add(store, None)
    assert store.entries("local") == [] and _allocated(memory) == 0
    with pytest.raises(InvalidRequest):
        _add(VolatileStates(), 10)  # no memory manager: no ram tier
