"""The memory manager: observed use + Werk-managed allocations + pending reservations.

**Pools.** On a discrete system the ``ram`` tier is charged to the host pool and the ``vram`` tier
to the accelerator pool (the sum of the sampled devices); the two never share a budget. On a
unified system (see :mod:`werk.memory.telemetry`) both tiers charge one ``shared`` pool sized by
the host sample.

**Effective use** of a pool is ``max(observed_used, allocated) + reserved``: committed
allocations normally show up in the observed figure already, so they are not added twice, but
they are never *under*-counted when the observation lags; pending reservations are not yet
observable and are always added. Pressure comes from ``effective / capacity`` through
:func:`werk.memory.pressure.next_level` (thresholds and 5 pp hysteresis); the reported level is
the worst over the pools that matter: the host/shared pool always, the accelerator pool when
devices were sampled, when NVML failed after initialising, or when it holds managed bytes. Any
such pool with unknown capacity makes the level ``unknown``.

**Admission.** A reservation is a positive, bounded byte count on a tier. It is admitted only if
the pool's effective use plus the request stays *below the hard threshold*. Otherwise the
manager makes one bounded pressure-relief pass (:mod:`werk.memory.relief`) through the injected
:class:`ReliefCallbacks` and retries exactly once before raising :class:`werk.ResourceExhausted`
(retryable).

**Lifecycle.** ``reserve`` → the backend loads/restores/decodes → ``commit(reservation,
actual)`` (only when ``0 < actual <= reserved``; otherwise the reservation is released and
:class:`ReservationMismatch` raised) or ``cancel(reservation)`` → later ``release(allocation,
release_fn)``. If ``release_fn`` (the backend's release) fails, Werk does not claim the memory
was freed: the allocation stays accounted, is pinned against policy movement,
``failed_releases`` counts the failed attempt and ``orphaned_release_bytes`` holds its bytes until
a later release of the same allocation succeeds.

**Counters.** ``failed_releases`` (monotonic), ``orphaned_release_bytes`` (current bytes kept
after failed releases), ``telemetry_errors`` (monotonic; a failed host sample, or an NVML sample
that failed after initialising), ``backend_cleanup_failures`` (monotonic) and
``backend_cleanup_latched`` (0/1). A failed sample leaves capacity unknown and never resets a
counter or the accounting.

All public methods are thread-safe. Backend callbacks (release functions, relief actions) run
outside the manager's lock, so they may call back into the manager.

The values it hands out and takes back (:class:`Reservation`, :class:`Allocation`, …) and the
``runtime.memory.reservations`` row live in :mod:`werk.memory.reservations` (re-exported here).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

import msgspec

from .._units import format_bytes
from ..protocol.base import rfc3339
from ..protocol.capabilities import CapabilityId, CapabilityReport
from ..protocol.errors import InvalidRequest, ResourceExhausted, Unavailable
from ..protocol.memory import (
    HostMemory,
    ManagedMemory,
    MemoryCounters,
    MemoryResponse,
    PressureLevel,
)
from ..protocol.residency import ExpertTier
from .pressure import HARD_THRESHOLD, Cooldown, next_level, utilisation, worst
from .relief import MAX_RELIEF_ACTIONS, ReliefPlan, plan_relief
from .reservations import (
    Allocation,
    MemoryTier,
    PoolView,
    ReliefCallbacks,
    ReliefReport,
    Reservation,
    ReservationMismatch,
    ReservationTooLarge,
    StaleReservation,
    reservations_capability,
)
from .telemetry import AcceleratorSample, is_apple_silicon, sample_accelerators, sample_host

__all__ = [
    "MAX_OWNER_LENGTH",
    "MAX_RECORDS",
    "Allocation",
    "MemoryManager",
    "MemoryTier",
    "PoolView",
    "ReliefCallbacks",
    "ReliefReport",
    "Reservation",
    "ReservationMismatch",
    "ReservationTooLarge",
    "StaleReservation",
    "reservations_capability",
]

log = logging.getLogger("werk.memory")

MAX_RECORDS = 65536
"""Bound on live reservations plus allocations (a full table is ``resource_exhausted``)."""
MAX_OWNER_LENGTH = 256

_CAPABILITY = CapabilityId.MEMORY_RESERVATIONS.value


class _Record(msgspec.Struct):
    id: str
    owner: str
    tier: MemoryTier
    nbytes: int
    state: Literal["pending", "committed", "releasing", "orphaned"]
    pinned: bool = False
    orphaned: bool = False


class _Counters(msgspec.Struct):
    failed_releases: int = 0
    orphaned_release_bytes: int = 0
    telemetry_errors: int = 0
    backend_cleanup_failures: int = 0
    backend_cleanup_latched: int = 0


class _Sample(msgspec.Struct):
    host: HostMemory | None
    accelerators: AcceleratorSample
    unified: bool
    wall: float
    pools: dict[str, PoolView] = msgspec.field(default_factory=dict)


def _relief_detail(plan: ReliefPlan | None) -> str:
    """What the relief pass did, for the ``resource_exhausted`` message."""
    if plan is None:
        return "; no relief pass ran"
    parts = []
    if plan.actions:
        parts.append("freed " + ", ".join(f"{a.id} ({a.kind})" for a in plan.actions))
    if plan.skipped:
        parts.append("skipped " + ", ".join(f"{cid} ({why})" for cid, why in plan.skipped))
    if plan.reason:
        parts.append(plan.reason)
    return "; relief: " + "; ".join(parts) if parts else ""


class MemoryManager:
    """Accounting, pressure and admission control for host and accelerator memory.

    :param host_sampler: returns the effective host memory; raises on failure.
    :param accelerator_sampler: returns an :class:`AcceleratorSample`.
    :param clock: monotonic seconds (cooldowns).
    :param wall_clock: POSIX seconds (``sampled_at``).
    :param unified_host: the host itself is a unified-memory system (default: detect Apple
        silicon); an NVML sample can also declare unified memory.
    :param relief: candidate and action callbacks for pressure relief (``None``: no relief).
    :param max_relief_actions: per-pass action bound.
    """

    def __init__(
        self,
        *,
        host_sampler: Callable[[], HostMemory] = sample_host,
        accelerator_sampler: Callable[[], AcceleratorSample] = sample_accelerators,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        unified_host: bool | None = None,
        relief: ReliefCallbacks | None = None,
        max_relief_actions: int = MAX_RELIEF_ACTIONS,
    ) -> None:
        if max_relief_actions < 1:
            raise ValueError("max_relief_actions must be at least 1")
        self._host_sampler = host_sampler
        self._accelerator_sampler = accelerator_sampler
        self._clock = clock
        self._wall_clock = wall_clock
        self._unified_host = is_apple_silicon() if unified_host is None else unified_host
        self._relief = relief
        self._max_relief_actions = max_relief_actions
        self._lock = threading.RLock()
        self._records: dict[str, _Record] = {}
        self._counters = _Counters()
        self._levels: dict[str, PressureLevel] = {}
        self._cooldown = Cooldown()
        self._participants: set[str] = set()
        self._last_relief: ReliefReport | None = None

    # -- configuration -------------------------------------------------------------------------

    def set_relief(self, relief: ReliefCallbacks | None) -> None:
        """Install (or remove) the pressure-relief callbacks."""
        with self._lock:
            self._relief = relief

    def set_participant(self, backend: str, participating: bool) -> None:
        """Record whether ``backend`` currently supplies bounded requirements (a hook answer)."""
        with self._lock:
            if participating:
                self._participants.add(backend)
            else:
                self._participants.discard(backend)

    @property
    def participating(self) -> bool:
        """Whether any loaded adapter takes part in admission control."""
        with self._lock:
            return bool(self._participants)

    def reservations_capability(
        self, uncovered: Mapping[str, str] | None = None
    ) -> CapabilityReport:
        """The ``runtime.memory.reservations`` row for the current participants and the
        configured models that would start unaccounted (``uncovered``)."""
        return reservations_capability(self.participating, uncovered)

    # -- observation ---------------------------------------------------------------------------

    def snapshot(self) -> MemoryResponse:
        """Sample now and report §4's ``GET /werk/v1/memory`` body."""
        with self._lock:
            sample = self._sample()
            allocated, reserved = self._managed_totals()
            return MemoryResponse(
                sampled_at=rfc3339(sample.wall),
                unified=sample.unified,
                host=sample.host,
                accelerators=sample.accelerators.devices,
                managed=ManagedMemory(allocated_bytes=allocated, reserved_bytes=reserved),
                pressure=self._overall(sample),
                counters=self._counter_struct(),
            )

    def pools(self) -> list[PoolView]:
        """Sample now and return the per-pool numbers behind the pressure level."""
        with self._lock:
            return list(self._sample().pools.values())

    def counters(self) -> MemoryCounters:
        with self._lock:
            return self._counter_struct()

    @property
    def last_relief(self) -> ReliefReport | None:
        with self._lock:
            return self._last_relief

    def pinned_owners(self) -> frozenset[str]:
        """Owners of allocations pinned against policy movement (failed releases)."""
        with self._lock:
            return frozenset(r.owner for r in self._records.values() if r.pinned)

    def is_pinned(self, allocation: Allocation) -> bool:
        with self._lock:
            record = self._records.get(allocation.id)
            return record is not None and record.pinned

    # -- reservations --------------------------------------------------------------------------

    def reserve(
        self, owner: str, nbytes: int, *, tier: MemoryTier, relieve: bool = True
    ) -> Reservation:
        """Reserve ``nbytes`` on ``tier`` for ``owner`` before invoking the backend.

        ``relieve=False`` skips the relief pass: a reservation that does not fit as things are
        fails at once (a preload must never unload what is already loaded).

        :raises werk.InvalidRequest: ``nbytes`` is not a positive integer, the owner is empty or
            too long, or the tier is not ``ram``/``vram``.
        :raises ReservationTooLarge: ``nbytes`` exceeds the pool's whole capacity.
        :raises werk.Unavailable: the pool's capacity is not observable now.
        :raises werk.ResourceExhausted: no room below the hard threshold, even after one relief
            pass and one retry (retryable).
        """
        tier = self._validate(owner, nbytes, tier)
        first = self._try_reserve(owner, nbytes, tier)
        if isinstance(first, Reservation):
            return first
        if not relieve:
            raise ResourceExhausted(
                f"reserving {format_bytes(nbytes)} on {tier} would reach the hard pressure"
                f" threshold: {first}; relief not attempted",
                capability=_CAPABILITY,
            )
        plan = self._relieve(tier, nbytes)
        second = self._try_reserve(owner, nbytes, tier)
        if isinstance(second, Reservation):
            return second
        raise ResourceExhausted(
            f"reserving {format_bytes(nbytes)} on {tier} would reach the hard pressure"
            f" threshold: {second}{_relief_detail(plan)}",
            capability=_CAPABILITY,
        )

    def commit(self, reservation: Reservation, actual_bytes: int) -> Allocation:
        """Turn a reservation into an allocation of what the backend actually holds.

        :raises StaleReservation: the reservation is not pending here.
        :raises ReservationMismatch: ``actual_bytes`` is not an integer in
            ``1..reservation.nbytes``; the reservation is released and the caller must discard
            the returned backend state.
        """
        with self._lock:
            record = self._pending(reservation)
            valid = (
                isinstance(actual_bytes, int)
                and not isinstance(actual_bytes, bool)
                and 0 < actual_bytes <= record.nbytes
            )
            if not valid:
                del self._records[record.id]
                raise ReservationMismatch(
                    f"the backend state reports {actual_bytes!r} bytes against a reservation of "
                    f"{record.nbytes}; the reservation was released",
                    capability=_CAPABILITY,
                )
            record.nbytes = actual_bytes
            record.state = "committed"
            return Allocation(
                id=record.id, owner=record.owner, tier=record.tier, nbytes=actual_bytes
            )

    def cancel(self, reservation: Reservation) -> None:
        """Drop a pending reservation (the backend call failed or was not made).

        :raises StaleReservation: the reservation is not pending here.
        """
        with self._lock:
            record = self._pending(reservation)
            del self._records[record.id]

    def release(self, allocation: Allocation, release_fn: Callable[[], object]) -> bool:
        """Release ``allocation`` by calling the backend's ``release_fn`` (outside the lock).

        :returns: ``True`` when the backend released it and the accounting was dropped;
            ``False`` when the backend release failed: the allocation stays accounted and
            pinned, ``failed_releases`` is incremented and its bytes are (or stay) counted in
            ``orphaned_release_bytes``. A later call may retry.
        :raises StaleReservation: the allocation is unknown here or a release is in flight.
        """
        with self._lock:
            record = self._records.get(allocation.id)
            if record is None or record.state not in ("committed", "orphaned"):
                raise StaleReservation(f"allocation {allocation.id} cannot be released now")
            record.state = "releasing"
        try:
            release_fn()
            ok = True
        except Exception:
            log.warning("backend release of allocation %s failed", allocation.id, exc_info=True)
            ok = False
        with self._lock:
            if ok:
                del self._records[record.id]
                if record.orphaned:
                    self._counters.orphaned_release_bytes -= record.nbytes
                return True
            self._counters.failed_releases += 1
            if not record.orphaned:
                self._counters.orphaned_release_bytes += record.nbytes
            record.orphaned = True
            record.pinned = True
            record.state = "orphaned"
            return False

    def record_backend_cleanup_failure(self, *, latch: bool = False) -> None:
        """Count a backend cleanup failure; ``latch`` sets ``backend_cleanup_latched`` to 1."""
        with self._lock:
            self._counters.backend_cleanup_failures += 1
            if latch:
                self._counters.backend_cleanup_latched = 1

    def clear_backend_cleanup_latch(self) -> None:
        with self._lock:
            self._counters.backend_cleanup_latched = 0

    # -- internals -----------------------------------------------------------------------------

    @staticmethod
    def _validate(owner: str, nbytes: int, tier: object) -> MemoryTier:
        if not isinstance(owner, str) or not owner or len(owner) > MAX_OWNER_LENGTH:
            raise InvalidRequest(f"a reservation owner is 1..{MAX_OWNER_LENGTH} characters")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise InvalidRequest(
                f"a reservation needs a positive byte count, got {nbytes!r}", capability=_CAPABILITY
            )
        if tier == ExpertTier.RAM:
            return ExpertTier.RAM
        if tier == ExpertTier.VRAM:
            return ExpertTier.VRAM
        raise InvalidRequest(f"memory can be reserved on ram or vram, not {tier!r}")

    def _pending(self, reservation: Reservation) -> _Record:
        record = self._records.get(reservation.id)
        if record is None or record.state != "pending" or record.owner != reservation.owner:
            raise StaleReservation(f"reservation {reservation.id} is not pending")
        return record

    def _try_reserve(self, owner: str, nbytes: int, tier: MemoryTier) -> Reservation | str:
        """Admit and record, or return why not (a string) when there is no room now."""
        with self._lock:
            sample = self._sample()
            pool = sample.pools.get(self._pool_name(tier, sample.unified))
            if pool is None or pool.capacity_bytes is None or pool.effective_used_bytes is None:
                raise Unavailable(
                    f"the capacity of the {tier} pool is not observable now",
                    capability=_CAPABILITY,
                )
            if nbytes > pool.capacity_bytes:
                raise ReservationTooLarge(
                    f"{nbytes} bytes exceed the {pool.name} pool's capacity of "
                    f"{pool.capacity_bytes} bytes",
                    capability=_CAPABILITY,
                )
            projected = pool.effective_used_bytes + nbytes
            if utilisation(projected, pool.capacity_bytes) >= HARD_THRESHOLD:
                below_hard = int(pool.capacity_bytes * HARD_THRESHOLD)
                available = max(0, below_hard - pool.effective_used_bytes)
                return (
                    f"{format_bytes(available)} available below the hard threshold"
                    f" ({float(HARD_THRESHOLD):.0%} of the {pool.name} pool's"
                    f" {format_bytes(pool.capacity_bytes)};"
                    f" {format_bytes(pool.effective_used_bytes)} in use)"
                )
            if len(self._records) >= MAX_RECORDS:
                raise ResourceExhausted(
                    f"the reservation table holds {MAX_RECORDS} entries", capability=_CAPABILITY
                )
            reservation_id = "rsv_" + secrets.token_hex(8)
            self._records[reservation_id] = _Record(
                id=reservation_id, owner=owner, tier=tier, nbytes=nbytes, state="pending"
            )
            self._sample_pools(sample)  # the new reservation counts in the pressure level
            return Reservation(id=reservation_id, owner=owner, tier=tier, nbytes=nbytes)

    def _relieve(self, tier: MemoryTier, nbytes: int) -> ReliefPlan | None:
        """One bounded relief pass; callbacks run outside the lock."""
        with self._lock:
            relief = self._relief
        if relief is None:
            return None
        try:
            offered = list(relief.candidates(tier))
        except Exception:
            log.warning("relief candidates for %s could not be listed", tier, exc_info=True)
            return None
        with self._lock:
            sample = self._sample()
            pool = sample.pools.get(self._pool_name(tier, sample.unified))
            if pool is None or pool.capacity_bytes is None or pool.effective_used_bytes is None:
                return None
            pinned = {r.owner for r in self._records.values() if r.pinned}
            candidates = [
                msgspec.structs.replace(c, pinned=True) if c.id in pinned else c for c in offered
            ]
            now = self._clock()
            plan = plan_relief(
                used=pool.effective_used_bytes,
                requested=nbytes,
                total=pool.capacity_bytes,
                candidates=candidates,
                now=now,
                last_action_at=self._cooldown.last_action_at,
                max_actions=self._max_relief_actions,
            )
            if plan.actions and not self._cooldown.try_acquire(now):
                return None  # unreachable under the lock; kept as a guard
        succeeded: list[str] = []
        failed: list[str] = []
        for action in plan.actions:
            try:
                ok = bool(relief.execute(action))
            except Exception:
                log.warning("relief action %s on %s failed", action.kind, action.id, exc_info=True)
                ok = False
            (succeeded if ok else failed).append(action.id)
        with self._lock:
            self._last_relief = ReliefReport(
                plan=plan, succeeded=tuple(succeeded), failed=tuple(failed)
            )
        return plan

    @staticmethod
    def _pool_name(tier: MemoryTier, unified: bool) -> Literal["shared", "ram", "vram"]:
        if unified:
            return "shared"
        return "vram" if tier == ExpertTier.VRAM else "ram"

    def _sample(self) -> _Sample:
        """Take one sample of every source and re-evaluate the pools (lock held)."""
        host: HostMemory | None
        try:
            host = self._host_sampler()
        except Exception as exc:
            log.warning("host memory sample failed: %s", exc)
            self._counters.telemetry_errors += 1
            host = None
        try:
            accelerators = self._accelerator_sampler()
        except Exception as exc:
            log.warning("accelerator memory sample failed: %s", exc)
            accelerators = AcceleratorSample(None, "accelerator sampler raised", failed=True)
        if accelerators.failed:
            self._counters.telemetry_errors += 1
        sample = _Sample(
            host=host,
            accelerators=accelerators,
            unified=self._unified_host or accelerators.unified,
            wall=self._wall_clock(),
        )
        self._sample_pools(sample)
        return sample

    def _sample_pools(self, sample: _Sample) -> None:
        sample.pools = {}
        host_total = sample.host.total_bytes if sample.host is not None else None
        host_used = sample.host.used_bytes if sample.host is not None else None
        if sample.unified:
            sample.pools["shared"] = self._pool("shared", host_total, host_used, None)
            return
        sample.pools["ram"] = self._pool("ram", host_total, host_used, ExpertTier.RAM)
        devices = sample.accelerators.devices
        vram_total: int | None = None
        vram_used: int | None = None
        if devices:
            totals = [d.total_bytes for d in devices]
            useds = [d.used_bytes for d in devices]
            if all(t is not None for t in totals) and all(u is not None for u in useds):
                vram_total = sum(t for t in totals if t is not None)
                vram_used = sum(u for u in useds if u is not None)
        vram_managed = any(r.tier == ExpertTier.VRAM for r in self._records.values())
        if devices or sample.accelerators.failed or vram_managed:
            sample.pools["vram"] = self._pool("vram", vram_total, vram_used, ExpertTier.VRAM)

    def _pool(
        self,
        name: Literal["shared", "ram", "vram"],
        capacity: int | None,
        observed: int | None,
        tier: MemoryTier | None,
    ) -> PoolView:
        records = [r for r in self._records.values() if tier is None or r.tier == tier]
        allocated = sum(r.nbytes for r in records if r.state != "pending")
        reserved = sum(r.nbytes for r in records if r.state == "pending")
        if capacity is None or capacity <= 0 or observed is None:
            return PoolView(
                name=name,
                capacity_bytes=None,
                observed_used_bytes=observed,
                allocated_bytes=allocated,
                reserved_bytes=reserved,
                effective_used_bytes=None,
                pressure=PressureLevel.UNKNOWN,
            )
        effective = max(observed, allocated) + reserved
        level = next_level(self._levels.get(name), utilisation(effective, capacity))
        self._levels[name] = level
        return PoolView(
            name=name,
            capacity_bytes=capacity,
            observed_used_bytes=observed,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            effective_used_bytes=effective,
            pressure=level,
        )

    def _overall(self, sample: _Sample) -> PressureLevel:
        return worst([pool.pressure for pool in sample.pools.values()])

    def _managed_totals(self) -> tuple[int, int]:
        allocated = sum(r.nbytes for r in self._records.values() if r.state != "pending")
        reserved = sum(r.nbytes for r in self._records.values() if r.state == "pending")
        return allocated, reserved

    def _counter_struct(self) -> MemoryCounters:
        c = self._counters
        return MemoryCounters(
            failed_releases=c.failed_releases,
            orphaned_release_bytes=c.orphaned_release_bytes,
            telemetry_errors=c.telemetry_errors,
            backend_cleanup_failures=c.backend_cleanup_failures,
            backend_cleanup_latched=c.backend_cleanup_latched,
        )
