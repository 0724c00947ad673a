"""Admission control of runtime starts: a backend's requirement is reserved before the start,
a start that does not fit unloads idle runtimes (least recently used first) through one relief
pass, and one that still does not fit fails with ``resource_exhausted`` while nothing loaded is
touched. An in-process backend and a scripted host sample stand in for the machine here;
``plugins/werk-llamacpp/tests/test_llamacpp_admission.py`` runs the same through a real
``werk serve`` and real llama-server children under a cgroup memory limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import werk
from werk import (
    BackendDescriptor,
    BackendState,
    InvalidRequest,
    ModelSpec,
    ResourceExhausted,
    Runtime,
    RuntimeRequirement,
    StateKind,
    Unavailable,
    hookimpl,
)
from werk.control.runtimes import RuntimeManager
from werk.control.volatile import VolatileStates
from werk.memory import AcceleratorSample, MemoryManager
from werk.protocol import CapabilityStatus, HostMemory, Tier
from werk.state.envelope import Envelope
from werk.testing.service import local_service

GiB = 1 << 30


def spec(model: str) -> ModelSpec:
    return ModelSpec(id=model, backend="sized", identity="sha256:" + "7" * 64)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Host:
    total: int = 100 * GiB
    used: int = 5 * GiB

    def __call__(self) -> HostMemory:
        return HostMemory(
            total_bytes=self.total, used_bytes=self.used, available_bytes=self.total - self.used
        )


class Backend:
    """Each model needs ``sizes[model]`` bytes (``None``: no bound given)."""

    def __init__(self, sizes: dict[str, int | None]) -> None:
        self.sizes = sizes
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.fail_start = False
        self.fail_stop = False
        self.fail_requirement = False

    async def requirement(self, model: ModelSpec) -> RuntimeRequirement | None:
        if self.fail_requirement:
            raise OSError("header unreadable")
        size = self.sizes[model.id]
        if size is None:
            return None
        weights = size * 3 // 4
        return RuntimeRequirement(
            nbytes=size, parts=(("weights", weights), ("kv cache", size - weights))
        )

    async def start(self, model: ModelSpec) -> Runtime:
        if self.fail_start:
            raise RuntimeError("no")
        generation = f"{model.id}_{len(self.started)}"
        self.started.append(generation)
        return Runtime(backend="sized", model=model, generation=generation)

    async def stop(self, runtime: Runtime) -> None:
        if self.fail_stop:
            raise RuntimeError("the child ignored SIGKILL")
        self.stopped.append(runtime.generation)
        runtime.alive = False

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(
            BackendDescriptor(
                name="sized", start=self.start, stop=self.stop, requirement=self.requirement
            )
        )


@dataclass
class Setup:
    backend: Backend
    memory: MemoryManager
    runtimes: RuntimeManager
    clock: Clock
    handoffs: set[str]
    pinned: set[str]
    states: VolatileStates | None = None


def setup(
    sizes: dict[str, int | None], host: Host | None = None, *, ram_states: bool = False
) -> Setup:
    backend, clock = Backend(sizes), Clock()
    memory = MemoryManager(
        host_sampler=host or Host(),
        accelerator_sampler=lambda: AcceleratorSample(None, "not sampled"),
        clock=clock,
        unified_host=False,
    )
    handoffs: set[str] = set()
    pinned: set[str] = set()
    states = VolatileStates(memory=memory) if ram_states else None
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sized", backend)])
    runtimes = RuntimeManager(
        pm,
        clock=clock,
        memory=memory,
        handoff_generations=lambda: handoffs,
        pinned_generations=lambda: pinned,
        relief_states=states,
    )
    return Setup(backend, memory, runtimes, clock, handoffs, pinned, states)


def managed(s: Setup) -> tuple[int, int]:
    snapshot = s.memory.snapshot()
    return snapshot.managed.allocated_bytes, snapshot.managed.reserved_bytes


@pytest.mark.anyio
async def test_a_start_reserves_its_requirement_and_a_stop_releases_it() -> None:
    s = setup({"a": 30 * GiB})
    with await s.runtimes.use(spec("a")):
        assert managed(s) == (30 * GiB, 0)
    [entry] = s.runtimes.entries()
    assert entry.reserved == 30 * GiB
    assert await s.runtimes.stop("a")
    assert managed(s) == (0, 0)
    assert s.memory.counters().failed_releases == 0


@pytest.mark.anyio
async def test_relief_unloads_the_least_recently_used_idle_runtime_and_the_start_succeeds() -> None:
    s = setup({"a": 30 * GiB, "b": 30 * GiB, "c": 40 * GiB})
    with await s.runtimes.use(spec("a")):
        pass
    s.clock.now += 1
    with await s.runtimes.use(spec("b")):
        pass
    s.clock.now += 1
    # 60 GiB loaded; 40 more would be 100 % of 100 GiB: relief frees "a" (used longest ago)
    with await s.runtimes.use(spec("c")):
        pass
    assert s.backend.stopped == ["a_0"]
    assert sorted(s.runtimes.live()) == ["b", "c"]
    assert managed(s) == (70 * GiB, 0)
    report = s.memory.last_relief
    assert report is not None and report.succeeded == ("model a",)


@pytest.mark.anyio
async def test_a_busy_runtime_is_never_unloaded_and_the_start_fails_retryably() -> None:
    s = setup({"a": 50 * GiB, "b": 50 * GiB})
    use = await s.runtimes.use(spec("a"))
    with pytest.raises(ResourceExhausted) as denied:
        await s.runtimes.use(spec("b"))
    message = denied.value.message
    assert denied.value.retryable
    assert "cannot load: model 'b' needs 50.0 GiB (weights 37.5 GiB + kv cache 12.5 GiB)" in (
        message
    )
    assert "35.0 GiB available below the hard threshold" in message  # 85 - 50
    assert "skipped model a (in use)" in message
    assert s.backend.started == ["a_0"] and s.backend.stopped == []
    assert list(s.runtimes.live()) == ["a"]
    assert managed(s) == (50 * GiB, 0)  # b's reservation is not left behind
    use.release()
    # At once: a denial is not a failed start (no backoff), and the denied pass ran no action
    # (no relief cooldown either).
    with await s.runtimes.use(spec("b")):
        pass
    assert s.backend.stopped == ["a_0"]


@pytest.mark.anyio
@pytest.mark.parametrize(("kind", "reason"), [("handoff", "live handoff"), ("pinned", "pinned")])
async def test_runtimes_with_a_live_handoff_or_a_pinned_state_are_skipped(
    kind: str, reason: str
) -> None:
    s = setup({"a": 50 * GiB, "b": 50 * GiB})
    with await s.runtimes.use(spec("a")):
        pass
    (s.handoffs if kind == "handoff" else s.pinned).add("a_0")
    with pytest.raises(ResourceExhausted, match=f"skipped model a \\({reason}\\)"):
        await s.runtimes.use(spec("b"))
    assert s.backend.stopped == [] and list(s.runtimes.live()) == ["a"]


@pytest.mark.anyio
async def test_a_failed_start_returns_its_reservation() -> None:
    s = setup({"a": 30 * GiB})
    s.backend.fail_start = True
    with pytest.raises(Unavailable, match="could not start model 'a'"):
        await s.runtimes.use(spec("a"))
    assert managed(s) == (0, 0)


@pytest.mark.anyio
async def test_a_requirement_larger_than_the_pool_can_never_fit() -> None:
    s = setup({"a": 200 * GiB})
    with pytest.raises(InvalidRequest, match=r"cannot load: model 'a' needs 200\.0 GiB.*capacity"):
        await s.runtimes.use(spec("a"))
    assert s.backend.started == [] and managed(s) == (0, 0)


@pytest.mark.anyio
async def test_no_bound_starts_unaccounted_and_a_failing_requirement_fails_the_start() -> None:
    s = setup({"a": None, "b": 10 * GiB})
    with await s.runtimes.use(spec("a")):
        pass
    [entry] = s.runtimes.entries()
    assert entry.reserved is None and managed(s) == (0, 0)
    s.backend.fail_requirement = True
    with pytest.raises(Unavailable, match="could not compute the memory model 'b' needs"):
        await s.runtimes.use(spec("b"))
    assert s.backend.started == ["a_0"]


@pytest.mark.anyio
async def test_a_failed_stop_keeps_the_memory_accounted_and_counts_a_failed_release() -> None:
    s = setup({"a": 30 * GiB})
    with await s.runtimes.use(spec("a")):
        pass
    s.backend.fail_stop = True
    await s.runtimes.stop("a")
    counters = s.memory.counters()
    assert counters.failed_releases == 1
    assert counters.orphaned_release_bytes == 30 * GiB
    assert managed(s) == (30 * GiB, 0)  # never claimed as freed
    assert s.memory.pinned_owners() == {"model a"}


def test_a_requirement_is_validated() -> None:
    for bad in (0, -1, 1 << 51, True):
        with pytest.raises(ValueError, match="1\\.\\."):
            RuntimeRequirement(nbytes=bad)
    with pytest.raises(ValueError, match="sum"):
        RuntimeRequirement(nbytes=10, parts=(("weights", 4),))
    with pytest.raises(ValueError, match="tier"):
        RuntimeRequirement(nbytes=10, tier="external")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cannot start"):
        BackendDescriptor(name="x", requirement=Backend({}).requirement)


@pytest.mark.anyio
async def test_the_service_reports_the_row_and_each_runtimes_reservation(tmp_path: Path) -> None:
    backend = Backend({"a": GiB})
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sized", backend)])
    async with local_service([spec("a")], home=tmp_path, pm=pm) as service:
        capabilities = await service.capabilities()
        [row] = [r for r in capabilities.capabilities if r.id == "runtime.memory.reservations"]
        assert row.status == CapabilityStatus.SUPPORTED
        with await service.runtimes.use(spec("a")):
            pass
        [listed] = (await service.runtimes_listing()).runtimes
        assert listed.reserved_bytes == GiB
    assert MemoryManager().reservations_capability().status == CapabilityStatus.UNAVAILABLE


@pytest.mark.anyio
async def test_a_model_that_would_start_unaccounted_makes_the_row_unavailable(
    tmp_path: Path,
) -> None:
    backend = Backend({"a": GiB, "b": None})
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sized", backend)])
    async with local_service([spec("a"), spec("b")], home=tmp_path, pm=pm) as service:
        rows = (await service.capabilities()).capabilities
        [row] = [r for r in rows if r.id == "runtime.memory.reservations"]
        assert row.status == CapabilityStatus.UNAVAILABLE
        assert row.reason is not None and "would start unaccounted: b: backend" in row.reason
        backend.fail_requirement = True
        rows = (await service.capabilities()).capabilities
        [row] = [r for r in rows if r.id == "runtime.memory.reservations"]
        assert row.reason is not None and "a: its requirement cannot be computed" in row.reason
        assert backend.started == []  # computing the row starts nothing


@pytest.mark.anyio
async def test_a_preload_never_unloads_a_loaded_runtime_and_its_failure_starts_no_backoff() -> None:
    s = setup({"a": 50 * GiB, "b": 50 * GiB, "c": 10 * GiB, "d": 10 * GiB})
    with await s.runtimes.use(spec("a")):
        pass
    s.clock.now += 1
    with pytest.raises(ResourceExhausted, match="relief not attempted"):
        await s.runtimes.get(spec("b"), preload=True)
    assert s.backend.stopped == [] and list(s.runtimes.live()) == ["a"]
    assert s.memory.last_relief is None
    assert managed(s) == (50 * GiB, 0)
    s.backend.fail_start = True
    with pytest.raises(Unavailable, match="could not start model 'c'"):
        await s.runtimes.get(spec("c"), preload=True)
    with pytest.raises(Unavailable, match="could not start model 'd'"):
        await s.runtimes.get(spec("d"))
    s.backend.fail_start = False
    with await s.runtimes.use(spec("c")):  # at once: the failed preload left no backoff
        pass
    with pytest.raises(Unavailable, match="failed to start recently"):  # a request's did
        await s.runtimes.use(spec("d"))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("preload", "keep_alive", "loaded"),
    [(True, 300.0, ["a", "b"]), (False, 300.0, []), (True, 0.0, [])],
)
async def test_the_service_preloads_its_models_in_order_while_they_fit(
    tmp_path: Path, preload: bool, keep_alive: float, loaded: list[str]
) -> None:
    backend = Backend({"a": 30 * GiB, "b": 30 * GiB, "c": 30 * GiB})
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sized", backend)])
    models = [spec("a"), spec("b"), spec("c")]
    memory = MemoryManager(
        host_sampler=Host(),
        accelerator_sampler=lambda: AcceleratorSample(None, "not sampled"),
        unified_host=False,
    )
    async with local_service(
        models, home=tmp_path, pm=pm, preload=preload, keep_alive_seconds=keep_alive, memory=memory
    ) as service:
        await service.preload()
        # a and b fit (60 of 100 GiB); c would reach 90 % and is left for its first request
        assert sorted(service.runtimes.live()) == loaded
        assert backend.stopped == []


@pytest.mark.anyio
async def test_closing_the_service_cancels_a_preload_that_is_still_starting(
    tmp_path: Path,
) -> None:
    """``werk serve`` closes the service twice (its lifespan, then its own exit path) and may
    do so while a model is still loading: the start is cancelled, nothing is left loaded, and
    neither close waits forever."""
    import anyio

    backend = Backend({"a": GiB, "b": GiB})
    entered, cancelled = anyio.Event(), []
    real_start = backend.start

    async def slow_start(model: ModelSpec) -> Runtime:
        if model.id == "b":
            entered.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled.append(model.id)
                raise
        return await real_start(model)

    backend.start = slow_start  # type: ignore[method-assign]
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sized", backend)])
    async with (
        local_service([spec("a"), spec("b")], home=tmp_path, pm=pm, preload=True) as service,
        anyio.create_task_group() as group,
    ):
        group.start_soon(service.preload)
        with anyio.fail_after(10):
            await entered.wait()
            await service.aclose()
            await service.aclose()
        assert cancelled == ["b"]
        assert backend.stopped == ["a_0"] and service.runtimes.live() == {}
        await service.preload()  # after a close nothing starts any more
        assert backend.started == ["a_0"]


@pytest.mark.anyio
async def test_relief_drops_unpinned_ram_states_before_a_start_fails() -> None:
    """States of an in-process backend (tier ``ram``) are relief candidates too: an unpinned
    one is dropped to make room, a pinned one never."""
    s = setup({"c": 40 * GiB}, ram_states=True)
    states = s.states
    assert states is not None
    envelope = Envelope(
        adapter="a", adapter_version="1", backend="inproc", executable="", model_identity="x",
        runtime_args=(), cache_layout="", generation="g_0", principal="local",
    )  # fmt: skip

    def keep(nbytes: int, pinned: bool) -> str:
        entry = states.add(
            principal="local", envelope=envelope, model="m", backend="inproc", fingerprint="f",
            state=BackendState(
                kind=StateKind.HANDLE, handle=object(), generation="g_0", logical_bytes=nbytes
            ),
            ttl_seconds=None, pinned=pinned, tier=Tier.RAM,
        )  # fmt: skip
        return entry.id

    dropped, kept = keep(40 * GiB, False), keep(20 * GiB, True)
    assert managed(s) == (60 * GiB, 0)
    # 5 + 60 + 40 GiB would be 105 %: relief drops the unpinned state, the start succeeds
    with await s.runtimes.use(spec("c")):
        pass
    assert [e.id for e in states.entries("local")] == [kept]
    assert dropped not in {e.id for e in states.entries("local")}
    assert managed(s) == (60 * GiB, 0)
    report = s.memory.last_relief
    assert report is not None and [a.id for a in report.plan.actions] == [f"state {dropped}"]
