"""MemoryManager: snapshot shape, telemetry failures, pools, reservations, relief, hysteresis."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field

import msgspec
import psutil
import pytest

from werk import CapabilityStatus, InvalidRequest, ResourceExhausted, Unavailable
from werk.memory import (
    AcceleratorSample,
    MemoryManager,
    ReliefAction,
    ReliefCallbacks,
    ReliefCandidate,
    ReliefKind,
    ReservationMismatch,
    ReservationTooLarge,
    StaleReservation,
    TelemetryError,
    reservations_capability,
    sample_accelerators,
)
from werk.memory.manager import Allocation, MemoryTier
from werk.protocol import encode
from werk.protocol.memory import AcceleratorMemory, HostMemory, PressureLevel
from werk.protocol.residency import ExpertTier

RAM: MemoryTier = ExpertTier.RAM
VRAM: MemoryTier = ExpertTier.VRAM
GiB = 1 << 30


@dataclass
class Host:
    total: int = 100 * GiB
    used: int = 50 * GiB
    fail: bool = False

    def __call__(self) -> HostMemory:
        if self.fail:
            raise TelemetryError("host memory sampling failed: OSError")
        return HostMemory(
            total_bytes=self.total, used_bytes=self.used, available_bytes=self.total - self.used
        )


@dataclass
class Accel:
    sample: AcceleratorSample = field(default_factory=lambda: AcceleratorSample(None, "no NVML"))

    def __call__(self) -> AcceleratorSample:
        return self.sample


class Clock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


def make(host: Host | None = None, accel: Accel | None = None, **kw: object) -> MemoryManager:
    return MemoryManager(
        host_sampler=host or Host(),
        accelerator_sampler=accel or Accel(),
        clock=kw.pop("clock", Clock()),
        wall_clock=lambda: 1_780_000_000.25,  # type: ignore[arg-type]
        unified_host=kw.pop("unified_host", False),
        **kw,  # type: ignore[arg-type]
    )


def gpu(total: int | None = 80 * GiB, used: int | None = 0) -> AcceleratorSample:
    return AcceleratorSample(
        [AcceleratorMemory(index=0, name="GPU", total_bytes=total, used_bytes=used)]
    )


# -- snapshot ------------------------------------------------------------------------------------


def test_snapshot_has_the_exact_protocol_shape() -> None:
    body = msgspec.json.decode(encode(make().snapshot()))
    assert set(body) == {
        "sampled_at",
        "unified",
        "host",
        "accelerators",
        "managed",
        "pressure",
        "counters",
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", body["sampled_at"])
    assert body["sampled_at"] == "2026-05-28T20:26:40.250Z"
    assert body["host"] == {
        "total_bytes": 100 * GiB,
        "used_bytes": 50 * GiB,
        "available_bytes": 50 * GiB,
    }
    assert body["accelerators"] is None and body["unified"] is False
    assert body["managed"] == {"allocated_bytes": 0, "reserved_bytes": 0}
    assert body["pressure"] == "normal"
    assert body["counters"] == {
        "failed_releases": 0,
        "orphaned_release_bytes": 0,
        "telemetry_errors": 0,
        "backend_cleanup_failures": 0,
        "backend_cleanup_latched": 0,
    }


def test_failed_sample_keeps_counters_and_accounting() -> None:
    host = Host()
    manager = make(host)
    allocation = manager.commit(manager.reserve("s1", GiB, tier=RAM), GiB)
    assert not manager.release(allocation, _raise)
    manager.record_backend_cleanup_failure(latch=True)
    host.fail = True
    snap = manager.snapshot()
    assert snap.host is None and snap.pressure is PressureLevel.UNKNOWN
    assert snap.counters.telemetry_errors == 1
    assert snap.counters.failed_releases == 1 and snap.counters.orphaned_release_bytes == GiB
    assert (
        snap.counters.backend_cleanup_failures == 1 and snap.counters.backend_cleanup_latched == 1
    )
    assert snap.managed.allocated_bytes == GiB
    with pytest.raises(Unavailable) as err:
        manager.reserve("s2", GiB, tier=RAM)
    assert err.value.capability == "runtime.memory.reservations"
    host.fail = False
    snap = manager.snapshot()
    assert snap.pressure is PressureLevel.NORMAL and snap.host is not None
    assert snap.counters.telemetry_errors == 2  # the failed reserve sampled once more
    assert snap.counters.failed_releases == 1
    manager.clear_backend_cleanup_latch()
    assert manager.counters().backend_cleanup_latched == 0


def test_nvml_absent_is_not_an_error_but_nvml_failure_is() -> None:
    accel = Accel()
    manager = make(accel=accel)
    snap = manager.snapshot()
    assert snap.accelerators is None and snap.pressure is PressureLevel.NORMAL
    assert snap.counters.telemetry_errors == 0
    accel.sample = AcceleratorSample(None, "NVML sampling failed: x", failed=True)
    snap = manager.snapshot()
    assert snap.pressure is PressureLevel.UNKNOWN and snap.counters.telemetry_errors == 1


def test_discrete_pools_are_separate_with_an_nvml_double() -> None:
    from test_memory_telemetry import FakeDevice, FakeNVML

    nvml = FakeNVML([FakeDevice("NVIDIA L4", total=10 * GiB, used=GiB)])
    manager = make(Host(used=10 * GiB), Accel(sample_accelerators(nvml)))
    snap = manager.snapshot()
    assert not snap.unified and snap.accelerators is not None
    assert snap.accelerators[0].total_bytes == 10 * GiB
    # 7 GiB VRAM: 1 + 7 = 8 of 10 GiB -> soft on VRAM while RAM is at 10 %
    manager.reserve("m", 7 * GiB, tier=VRAM)
    pools = {p.name: p for p in manager.pools()}
    assert pools["vram"].reserved_bytes == 7 * GiB and pools["ram"].reserved_bytes == 0
    assert pools["vram"].pressure is PressureLevel.SOFT
    assert pools["ram"].pressure is PressureLevel.NORMAL
    assert manager.snapshot().pressure is PressureLevel.SOFT
    with pytest.raises(ResourceExhausted):
        manager.reserve("m2", GiB, tier=VRAM)  # 9 of 10 GiB would reach hard
    manager.reserve("m3", 20 * GiB, tier=RAM)  # RAM has room: tiers are apart


def test_unified_pool_is_shared_with_an_nvml_double() -> None:
    from test_memory_telemetry import FakeDevice, FakeNVML

    nvml = FakeNVML([FakeDevice("NVIDIA GH200 480GB", total=96 * GiB, used=0)])
    manager = make(Host(total=100 * GiB, used=50 * GiB), Accel(sample_accelerators(nvml)))
    snap = manager.snapshot()
    assert snap.unified
    manager.reserve("a", 20 * GiB, tier=VRAM)
    pools = manager.pools()
    assert [p.name for p in pools] == ["shared"] and pools[0].reserved_bytes == 20 * GiB
    with pytest.raises(ResourceExhausted):
        manager.reserve("b", 15 * GiB, tier=RAM)  # 50 + 20 + 15 = 85 %: the same pool


def test_apple_silicon_host_is_unified() -> None:
    assert make(unified_host=True).snapshot().unified


def test_vram_without_an_accelerator_is_unavailable() -> None:
    with pytest.raises(Unavailable):
        make(accel=Accel(AcceleratorSample([], "none"))).reserve("x", GiB, tier=VRAM)
    with pytest.raises(Unavailable):
        make(accel=Accel(gpu(total=None, used=None))).reserve("x", GiB, tier=VRAM)


# -- reservations --------------------------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [0, -1, True, 1.5, "1"])
def test_reserve_rejects_non_positive_or_non_integer(nbytes: object) -> None:
    with pytest.raises(InvalidRequest):
        make().reserve("o", nbytes, tier=RAM)  # type: ignore[arg-type]


def test_reserve_rejects_bad_owner_and_tier() -> None:
    with pytest.raises(InvalidRequest):
        make().reserve("", 1, tier=RAM)
    with pytest.raises(InvalidRequest):
        make().reserve("o", 1, tier=ExpertTier.EXTERNAL)  # type: ignore[arg-type]


def test_reserve_larger_than_capacity_is_typed() -> None:
    with pytest.raises(ReservationTooLarge) as err:
        make().reserve("o", 101 * GiB, tier=RAM)
    assert isinstance(err.value, InvalidRequest) and not err.value.retryable


def test_reserve_at_the_hard_threshold_is_retryable_exhaustion() -> None:
    manager = make(Host(used=50 * GiB))
    manager.reserve("a", 34 * GiB, tier=RAM)  # 84 %
    with pytest.raises(ResourceExhausted) as err:
        manager.reserve("b", GiB, tier=RAM)  # 85 %
    assert err.value.retryable and err.value.capability == "runtime.memory.reservations"
    assert manager.snapshot().managed.reserved_bytes == 34 * GiB


def test_committed_allocations_are_not_double_counted_with_observed_use() -> None:
    host = Host(used=10 * GiB)
    manager = make(host)
    manager.commit(manager.reserve("a", 30 * GiB, tier=RAM), 30 * GiB)
    # the backend has not allocated yet (observed 10): managed 30 counts
    assert {p.name: p for p in manager.pools()}["ram"].effective_used_bytes == 30 * GiB
    host.used = 40 * GiB  # now observed (includes the 30)
    assert {p.name: p for p in manager.pools()}["ram"].effective_used_bytes == 40 * GiB


def test_commit_only_when_the_state_agrees() -> None:
    manager = make()
    r = manager.reserve("a", 4 * GiB, tier=RAM)
    with pytest.raises(ReservationMismatch):
        manager.commit(r, 4 * GiB + 1)
    assert manager.snapshot().managed.reserved_bytes == 0  # released
    with pytest.raises(StaleReservation):
        manager.commit(r, GiB)
    r2 = manager.reserve("b", 4 * GiB, tier=RAM)
    for bad in (0, -1, None):
        r3 = manager.reserve("c", GiB, tier=RAM)
        with pytest.raises(ReservationMismatch):
            manager.commit(r3, bad)  # type: ignore[arg-type]
    allocation = manager.commit(r2, 3 * GiB)
    snap = manager.snapshot()
    assert (snap.managed.allocated_bytes, snap.managed.reserved_bytes) == (3 * GiB, 0)
    assert allocation.nbytes == 3 * GiB and allocation.owner == "b"
    with pytest.raises(StaleReservation):
        manager.cancel(r2)


def test_cancel_drops_a_pending_reservation() -> None:
    manager = make()
    r = manager.reserve("a", GiB, tier=RAM)
    manager.cancel(r)
    assert manager.snapshot().managed.reserved_bytes == 0
    with pytest.raises(StaleReservation):
        manager.cancel(r)


def _raise() -> None:
    raise RuntimeError("backend refused to free the slot")


def test_failed_release_stays_accounted_and_pinned_until_a_retry_succeeds() -> None:
    manager = make()
    allocation = manager.commit(manager.reserve("state-1", 2 * GiB, tier=RAM), 2 * GiB)
    assert manager.release(allocation, _raise) is False
    assert manager.is_pinned(allocation) and manager.pinned_owners() == {"state-1"}
    snap = manager.snapshot()
    assert snap.managed.allocated_bytes == 2 * GiB
    assert (snap.counters.failed_releases, snap.counters.orphaned_release_bytes) == (1, 2 * GiB)
    assert manager.release(allocation, _raise) is False  # a second failure
    snap = manager.snapshot()
    assert (snap.counters.failed_releases, snap.counters.orphaned_release_bytes) == (2, 2 * GiB)
    calls: list[int] = []
    assert manager.release(allocation, lambda: calls.append(1)) is True
    snap = manager.snapshot()
    assert calls == [1] and snap.managed.allocated_bytes == 0
    assert (snap.counters.failed_releases, snap.counters.orphaned_release_bytes) == (2, 0)
    with pytest.raises(StaleReservation):
        manager.release(allocation, lambda: None)


def test_release_callback_may_reenter_and_unknown_allocations_are_refused() -> None:
    manager = make()
    allocation = manager.commit(manager.reserve("a", GiB, tier=RAM), GiB)
    seen: list[int] = []
    assert manager.release(
        allocation, lambda: seen.append(manager.snapshot().managed.allocated_bytes)
    )
    assert seen == [GiB]
    with pytest.raises(StaleReservation):
        manager.release(Allocation(id="rsv_nope", owner="a", tier=RAM, nbytes=1), lambda: None)


def test_reservations_capability_row() -> None:
    manager = make()
    row = manager.reservations_capability()
    assert row.id == "runtime.memory.reservations" and row.status is CapabilityStatus.UNAVAILABLE
    assert row.reason and "unaccounted" in row.reason
    manager.set_participant("llamacpp", True)
    assert manager.participating
    assert manager.reservations_capability().status is CapabilityStatus.SUPPORTED
    manager.set_participant("llamacpp", False)
    assert not manager.participating
    assert reservations_capability(False).status is CapabilityStatus.UNAVAILABLE


# -- relief --------------------------------------------------------------------------------------


class States:
    """A toy backend: states with allocations, executed through the manager's release."""

    def __init__(self, manager: MemoryManager) -> None:
        self.manager = manager
        self.allocs: dict[str, Allocation] = {}
        self.meta: dict[str, ReliefCandidate] = {}
        self.executed: list[ReliefAction] = []

    def add(self, sid: str, size: int, last_used: float, **kw: bool) -> None:
        self.allocs[sid] = self.manager.commit(self.manager.reserve(sid, size, tier=RAM), size)
        self.meta[sid] = ReliefCandidate(id=sid, bytes=size, last_used=last_used, **kw)

    def candidates(self, tier: MemoryTier) -> list[ReliefCandidate]:
        assert tier == RAM
        return [self.meta[s] for s in self.allocs]

    def execute(self, action: ReliefAction) -> bool:
        self.executed.append(action)
        ok = self.manager.release(self.allocs[action.id], lambda: None)
        if ok:
            del self.allocs[action.id]
        return ok


def test_denied_reservation_triggers_one_relief_pass_then_one_retry() -> None:
    clock = Clock()
    host = Host(used=0)
    manager = make(host, clock=clock)
    states = States(manager)
    manager.set_relief(ReliefCallbacks(candidates=states.candidates, execute=states.execute))
    states.add("old-evict", 20 * GiB, 1.0)
    states.add("old-demote", 20 * GiB, 5.0, can_demote=True)
    states.add("pinned", 20 * GiB, 0.0, pinned=True)
    states.add("handoff", 20 * GiB, 0.0, live_handoff=True)
    # managed 80 of 100 GiB (soft); 10 more would be 90 % -> relief to below 85 %
    reservation = manager.reserve("new", 10 * GiB, tier=RAM)
    assert [(a.id, a.kind) for a in states.executed] == [("old-demote", ReliefKind.DEMOTE)]
    assert reservation.nbytes == 10 * GiB
    report = manager.last_relief
    assert report is not None and report.succeeded == ("old-demote",)
    assert dict(report.plan.skipped) == {"pinned": "pinned", "handoff": "live handoff"}
    # within the cooldown: denied without touching another state
    states.executed.clear()
    clock.now += 4.0
    with pytest.raises(ResourceExhausted, match="cooldown"):
        manager.reserve("newer", 20 * GiB, tier=RAM)
    assert states.executed == []
    clock.now += 1.0
    manager.reserve("newer", 5 * GiB, tier=RAM)  # 70 + 5 = 75: admitted, no relief needed
    assert states.executed == []


def test_a_denial_names_the_request_what_is_available_and_what_relief_skipped() -> None:
    manager = make(Host(used=0))
    states = States(manager)
    manager.set_relief(ReliefCallbacks(candidates=states.candidates, execute=states.execute))
    states.add("busy", 60 * GiB, 0.0, in_use=True)
    states.add("handoff", 20 * GiB, 1.0, live_handoff=True)
    with pytest.raises(ResourceExhausted) as denied:
        manager.reserve("new", 10 * GiB, tier=RAM)
    message = denied.value.message
    assert denied.value.retryable
    assert "reserving 10.0 GiB on ram" in message
    # 85 % of 100 GiB is 85 GiB; 80 GiB are in use: 5 GiB available
    assert "5.0 GiB available below the hard threshold (85% of the ram pool's 100.0 GiB" in message
    assert "80.0 GiB in use" in message
    assert "skipped busy (in use), handoff (live handoff)" in message
    assert states.executed == []


def test_relief_never_moves_an_allocation_pinned_by_a_failed_release() -> None:
    manager = make(Host(used=0))
    states = States(manager)
    manager.set_relief(ReliefCallbacks(candidates=states.candidates, execute=states.execute))
    states.add("orphan", 40 * GiB, 0.0)
    states.add("fresh", 40 * GiB, 9.0)
    assert not manager.release(states.allocs["orphan"], _raise)
    manager.reserve("new", 10 * GiB, tier=RAM)
    assert [a.id for a in states.executed] == ["fresh"]
    report = manager.last_relief
    assert report is not None and ("orphan", "pinned") in report.plan.skipped


def test_relief_failure_still_ends_in_a_typed_denial() -> None:
    manager = make(Host(used=0))
    states = States(manager)
    states.add("a", 80 * GiB, 0.0)

    def broken(action: ReliefAction) -> bool:
        raise RuntimeError("backend crashed")

    manager.set_relief(ReliefCallbacks(candidates=states.candidates, execute=broken))
    with pytest.raises(ResourceExhausted):
        manager.reserve("new", 10 * GiB, tier=RAM)
    report = manager.last_relief
    assert report is not None and report.failed == ("a",)
    assert manager.snapshot().managed.allocated_bytes == 80 * GiB


# -- hysteresis through the manager -------------------------------------------------------------


def test_manager_pressure_does_not_flap_inside_the_band() -> None:
    host = Host(used=86 * GiB)
    manager = make(host)
    assert manager.snapshot().pressure is PressureLevel.HARD
    for used in (84, 81, 83, 80, 84, 82):
        host.used = used * GiB
        assert manager.snapshot().pressure is PressureLevel.HARD
    host.used = 79 * GiB
    assert manager.snapshot().pressure is PressureLevel.SOFT


# -- concurrency and the real machine -----------------------------------------------------------


def test_concurrent_reservations_never_pass_the_hard_threshold() -> None:
    manager = make(Host(used=0))
    admitted: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(20):
            try:
                manager.reserve("w", GiB, tier=RAM)
            except ResourceExhausted:
                continue
            with lock:
                admitted.append(1)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 84  # 84 GiB of 100: the 85th would reach 85 %
    assert manager.snapshot().managed.reserved_bytes == 84 * GiB


def test_real_snapshot_matches_psutil_on_this_machine() -> None:
    manager = MemoryManager()
    before = psutil.virtual_memory()
    snap = manager.snapshot()
    after = psutil.virtual_memory()
    assert snap.host is not None
    from werk.memory import sample_host_budget

    if sample_host_budget().source != "physical":
        pytest.skip("this process runs under a cgroup limit below RAM")
    assert snap.host.total_bytes == before.total
    slack = 64 * (1 << 20)
    assert min(before.available, after.available) - slack <= snap.host.available_bytes
    assert snap.host.available_bytes <= max(before.available, after.available) + slack
    assert snap.pressure is not PressureLevel.UNKNOWN
    if sample_accelerators().devices is None:
        assert snap.accelerators is None  # not sampled here: null, never []
        assert snap.counters.telemetry_errors == 0  # NVML absent is not an error
