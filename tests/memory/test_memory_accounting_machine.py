"""Reservation accounting as a hypothesis state machine.

The model tracks every reservation and allocation independently of the manager. After every
step: committed + pending totals agree with the model and are never negative, each failed
release stays accounted and pinned, the counters match, and no admitted reservation ever took
the pool to the hard threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from werk import ResourceExhausted
from werk.memory import AcceleratorSample, MemoryManager, ReservationMismatch, StaleReservation
from werk.memory.manager import Allocation, Reservation
from werk.memory.pressure import HARD_THRESHOLD, utilisation
from werk.protocol.memory import HostMemory
from werk.protocol.residency import ExpertTier

TOTAL = 1000


@dataclass
class Host:
    used: int = 100

    def __call__(self) -> HostMemory:
        return HostMemory(
            total_bytes=TOTAL, used_bytes=self.used, available_bytes=TOTAL - self.used
        )


class Accounting(RuleBasedStateMachine):
    reservations = Bundle("reservations")
    allocations = Bundle("allocations")

    def __init__(self) -> None:
        super().__init__()
        self.host = Host()
        self.manager = MemoryManager(
            host_sampler=self.host,
            accelerator_sampler=lambda: AcceleratorSample(None, "none"),
            unified_host=False,
        )
        self.pending: dict[str, int] = {}
        self.committed: dict[str, int] = {}
        self.orphans: dict[str, int] = {}
        self.failed_releases = 0

    def _effective(self) -> int:
        return max(self.host.used, sum(self.committed.values())) + sum(self.pending.values())

    @rule(target=reservations, nbytes=st.integers(min_value=1, max_value=400))
    def reserve(self, nbytes: int) -> Reservation | None:
        fits = utilisation(self._effective() + nbytes, TOTAL) < HARD_THRESHOLD
        try:
            reservation = self.manager.reserve("o", nbytes, tier=ExpertTier.RAM)
        except ResourceExhausted:
            assert not fits
            return None
        assert fits
        self.pending[reservation.id] = nbytes
        return reservation

    @rule(
        target=allocations,
        reservation=consumes(reservations),
        fraction=st.fractions(min_value=0, max_value=2),
    )
    def commit(self, reservation: Reservation | None, fraction: object) -> Allocation | None:
        if reservation is None:
            return None
        actual = int(reservation.nbytes * fraction)  # type: ignore[operator]
        nbytes = self.pending.pop(reservation.id)
        if 0 < actual <= nbytes:
            allocation = self.manager.commit(reservation, actual)
            self.committed[allocation.id] = actual
            return allocation
        with pytest.raises(ReservationMismatch):
            self.manager.commit(reservation, actual)
        return None

    @rule(reservation=consumes(reservations))
    def cancel(self, reservation: Reservation | None) -> None:
        if reservation is None:
            return
        self.manager.cancel(reservation)
        del self.pending[reservation.id]
        with pytest.raises(StaleReservation):
            self.manager.cancel(reservation)

    @rule(allocation=allocations, succeed=st.booleans())
    def release(self, allocation: Allocation | None, succeed: bool) -> None:
        if allocation is None or allocation.id not in self.committed:
            return

        def backend() -> None:
            if not succeed:
                raise RuntimeError("release failed")

        assert self.manager.release(allocation, backend) is succeed
        if succeed:
            del self.committed[allocation.id]
            self.orphans.pop(allocation.id, None)
        else:
            self.failed_releases += 1
            self.orphans[allocation.id] = allocation.nbytes
            assert self.manager.is_pinned(allocation)

    @rule(used=st.integers(min_value=0, max_value=TOTAL))
    def observe(self, used: int) -> None:
        self.host.used = used

    @invariant()
    def totals_agree_and_are_never_negative(self) -> None:
        snap = self.manager.snapshot()
        assert snap.managed.allocated_bytes == sum(self.committed.values()) >= 0
        assert snap.managed.reserved_bytes == sum(self.pending.values()) >= 0
        assert snap.managed.allocated_bytes + snap.managed.reserved_bytes >= 0

    @invariant()
    def failed_releases_stay_accounted_and_pinned(self) -> None:
        counters = self.manager.counters()
        assert counters.failed_releases == self.failed_releases
        assert counters.orphaned_release_bytes == sum(self.orphans.values())
        assert all(oid in self.committed for oid in self.orphans)
        assert len(self.manager.pinned_owners()) == (1 if self.orphans else 0)


Accounting.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestAccounting = Accounting.TestCase
