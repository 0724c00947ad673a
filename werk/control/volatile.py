"""Volatile named states: held live by a backend, indexed here.

Tier ``backend``: the state lives in the backend's process (a llama-server slot). Tier ``ram``:
the backend runs inside ``werk serve`` (``BackendDescriptor.states_in_process``), so the state
is an object in this process's memory; its bytes are reserved in the memory manager when it is
kept (a reservation that does not fit refuses the state) and released when it is dropped.

They live exactly as long as the process generation that holds them: when a runtime dies or
is replaced, its volatile states are dropped. TTL is stronger than pin, as in the disk catalog.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..backends import BackendState
from ..memory.manager import MemoryManager
from ..memory.relief import ReliefCandidate
from ..memory.reservations import Allocation
from ..protocol import (
    ExpertTier,
    InvalidRequest,
    NotFound,
    ResourceExhausted,
    StateStatus,
    StateSummary,
    Tier,
    rfc3339,
)
from ..state.envelope import Envelope
from ..state.metadata import new_state_id

__all__ = ["MAX_VOLATILE_PER_PRINCIPAL", "VolatileState", "VolatileStates"]

MAX_VOLATILE_PER_PRINCIPAL = 256
_OWNER = "state "
"""Memory allocations of ``ram`` states are owned by ``state <id>``."""


@dataclass(kw_only=True, eq=False)
class VolatileState:
    id: str
    principal: str
    envelope: Envelope
    model: str
    backend: str
    fingerprint: str
    state: BackendState = field(repr=False)
    created_at: float
    expires_at: float | None
    pinned: bool = False
    last_accessed_at: float | None = None
    tier: Tier = Tier.BACKEND
    allocation: Allocation | None = field(default=None, repr=False)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def summary(self, *, reusable: bool, reason: str | None = None) -> StateSummary:
        return StateSummary(
            id=self.id,
            model=self.model,
            backend=self.backend,
            tier=self.tier,
            status=StateStatus.READY,
            logical_bytes=self.state.logical_bytes,
            created_at=rfc3339(self.created_at),
            last_accessed_at=rfc3339(self.last_accessed_at) if self.last_accessed_at else None,
            expires_at=rfc3339(self.expires_at) if self.expires_at is not None else None,
            pinned=self.pinned,
            reusable=reusable,
            reusable_reason=None if reusable else reason or "no loaded runtime can reuse it",
        )


class VolatileStates:
    """A thread-safe, bounded index of volatile states per principal."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_per_principal: int = MAX_VOLATILE_PER_PRINCIPAL,
        memory: MemoryManager | None = None,
    ) -> None:
        self._clock = clock
        self._max = max_per_principal
        self._memory = memory
        self._lock = threading.Lock()
        self._states: dict[str, VolatileState] = {}

    def add(
        self,
        *,
        principal: str,
        envelope: Envelope,
        model: str,
        backend: str,
        fingerprint: str,
        state: BackendState,
        ttl_seconds: int | None,
        pinned: bool,
        tier: Tier = Tier.BACKEND,
    ) -> VolatileState:
        """Index ``state``; tier ``ram`` reserves its ``logical_bytes`` first.

        :raises werk.ResourceExhausted: the caller holds the most volatile states, or the
            state's bytes do not fit the memory below the hard pressure threshold.
        """
        now = self._clock()
        self._release(self._take(lambda s: s.expired(now)))
        with self._lock:
            if sum(1 for s in self._states.values() if s.principal == principal) >= self._max:
                raise ResourceExhausted(f"at most {self._max} volatile states per caller")
        state_id = new_state_id()
        allocation = self._account(state_id, state, tier)
        with self._lock:
            entry = VolatileState(
                id=state_id,
                principal=principal,
                envelope=envelope,
                model=model,
                backend=backend,
                fingerprint=fingerprint,
                state=state,
                created_at=now,
                expires_at=now + ttl_seconds if ttl_seconds is not None else None,
                pinned=pinned,
                tier=tier,
                allocation=allocation,
            )
            self._states[entry.id] = entry
            return entry

    def _account(self, state_id: str, state: BackendState, tier: Tier) -> Allocation | None:
        if tier is Tier.BACKEND:
            return None
        if tier is not Tier.RAM or self._memory is None:
            raise InvalidRequest(f"volatile states of tier {tier} are not kept here")
        nbytes = state.logical_bytes
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise InvalidRequest("a state of tier ram must say its size (logical_bytes)")
        reservation = self._memory.reserve(_OWNER + state_id, nbytes, tier=ExpertTier.RAM)
        return self._memory.commit(reservation, nbytes)

    def _take(self, doomed: Callable[[VolatileState], bool]) -> list[VolatileState]:
        with self._lock:
            gone = [s for s in self._states.values() if doomed(s)]
            for entry in gone:
                del self._states[entry.id]
            return gone

    def _release(self, entries: list[VolatileState]) -> None:
        """Drop the accounting of removed entries (the state itself goes with its last
        reference)."""
        for entry in entries:
            if entry.allocation is not None and self._memory is not None:
                self._memory.release(entry.allocation, lambda: None)

    def entries(
        self, principal: str, *, model: str | None = None, pinned: bool | None = None
    ) -> list[VolatileState]:
        now = self._clock()
        with self._lock:
            return [
                s
                for s in self._states.values()
                if s.principal == principal
                and not s.expired(now)
                and (model is None or s.model == model)
                and (pinned is None or s.pinned == pinned)
            ]

    def counts(self) -> dict[tuple[str, str], int]:
        """Every principal's volatile states as ``(tier, status)`` → count (``/metrics``)."""
        now = self._clock()
        with self._lock:
            out: dict[tuple[str, str], int] = {}
            for s in self._states.values():
                key = (s.tier.value, "expired" if s.expired(now) else "ready")
                out[key] = out.get(key, 0) + 1
            return out

    def pinned_generations(self) -> frozenset[str]:
        """Generations holding a pinned, unexpired volatile state (of any principal): an idle
        unload would destroy it, so such a runtime stays loaded."""
        now = self._clock()
        with self._lock:
            return frozenset(
                s.envelope.generation
                for s in self._states.values()
                if s.pinned and not s.expired(now)
            )

    def get(self, principal: str, state_id: str) -> VolatileState:
        now = self._clock()
        with self._lock:
            entry = self._states.get(state_id)
            if entry is None or entry.principal != principal or entry.expired(now):
                raise NotFound("no such state")
            return entry

    def find(self, principal: str, fingerprint: str) -> list[VolatileState]:
        return [s for s in self.entries(principal) if s.fingerprint == fingerprint]

    def touch(self, entry: VolatileState) -> None:
        entry.last_accessed_at = self._clock()

    def set_pinned(self, principal: str, state_id: str, pinned: bool) -> VolatileState:
        entry = self.get(principal, state_id)
        entry.pinned = pinned
        return entry

    def remove(self, principal: str, state_id: str) -> None:
        self._release(self._take(lambda s: s.id == state_id and s.principal == principal))

    def drop_generations(self, live: frozenset[str]) -> int:
        """Forget states whose process generation is no longer live; returns how many."""
        dead = self._take(lambda s: s.envelope.generation not in live)
        self._release(dead)
        return len(dead)

    # -- memory relief (the runtime manager asks, from the reserving worker thread) ----------

    def relief_candidates(self, tier: str) -> list[ReliefCandidate]:
        """The ``ram`` states pressure relief may evict: never a pinned one."""
        if tier != ExpertTier.RAM:
            return []
        now, monotonic = self._clock(), time.monotonic()
        with self._lock:
            return [
                ReliefCandidate(
                    id=_OWNER + s.id,
                    bytes=s.allocation.nbytes,
                    # relief orders by the monotonic clock (the runtimes' last use)
                    last_used=monotonic - (now - (s.last_accessed_at or s.created_at)),
                    pinned=s.pinned,
                )
                for s in self._states.values()
                if s.allocation is not None
            ]

    def owns(self, owner: str) -> bool:
        return owner.startswith(_OWNER)

    def evict(self, owner: str) -> bool:
        """Drop the ``ram`` state ``owner`` names for relief (``False``: gone, or pinned now)."""
        state_id = owner.removeprefix(_OWNER)
        gone = self._take(lambda s: s.id == state_id and not s.pinned)
        self._release(gone)
        return bool(gone)

    def purge_expired(self) -> None:
        now = self._clock()
        self._release(self._take(lambda s: s.expired(now)))
