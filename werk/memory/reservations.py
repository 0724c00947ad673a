"""The values the memory manager hands out and takes back, and its capability row.

:class:`Reservation` (pending bytes on a tier) becomes an :class:`Allocation` on commit; the
relief pass talks to the runtime owner through :class:`ReliefCallbacks` and reports a
:class:`ReliefReport`; :class:`PoolView` is one pool's accounting at the last sample. Their
typed refusals are :class:`ReservationTooLarge`, :class:`ReservationMismatch` and
:class:`StaleReservation`. :func:`reservations_capability` is the host's
``runtime.memory.reservations`` row. The manager itself is :mod:`werk.memory.manager`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

import msgspec

from ..protocol.capabilities import CapabilityId, CapabilityReport, CapabilityStatus
from ..protocol.errors import BackendError, Conflict, InvalidRequest
from ..protocol.memory import PressureLevel
from ..protocol.residency import ExpertTier
from .relief import ReliefAction, ReliefCandidate, ReliefPlan

__all__ = [
    "Allocation",
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

MemoryTier = Literal[ExpertTier.VRAM, ExpertTier.RAM]
"""The tiers memory can be reserved on (``external`` is not memory Werk can account)."""

_CAPABILITY = CapabilityId.MEMORY_RESERVATIONS.value


class ReservationTooLarge(InvalidRequest):
    """The request can never fit: larger than the pool's whole capacity."""


class ReservationMismatch(BackendError):
    """The backend's returned state does not agree with its reservation (it was released)."""


class StaleReservation(Conflict):
    """The reservation or allocation is unknown here, or not in a state that allows this."""


class Reservation(msgspec.Struct, frozen=True, kw_only=True):
    """A pending reservation (a handle; the manager holds the accounting)."""

    id: str
    owner: str
    tier: MemoryTier
    nbytes: int


class Allocation(msgspec.Struct, frozen=True, kw_only=True):
    """A committed allocation (a handle; the manager holds the accounting)."""

    id: str
    owner: str
    tier: MemoryTier
    nbytes: int


class ReliefCallbacks(msgspec.Struct, frozen=True, kw_only=True):
    """How the manager finds and acts on relief candidates.

    :ivar candidates: the states of a tier that could be demoted or evicted.
    :ivar execute: perform one action; ``True`` when the backend reports success. Freed memory
        is returned to the manager by the executor through :meth:`MemoryManager.release`.
    """

    candidates: Callable[[MemoryTier], Sequence[ReliefCandidate]]
    execute: Callable[[ReliefAction], bool]


class ReliefReport(msgspec.Struct, frozen=True, kw_only=True):
    """What the last relief pass planned and what its callbacks reported."""

    plan: ReliefPlan
    succeeded: tuple[str, ...]
    failed: tuple[str, ...]


class PoolView(msgspec.Struct, frozen=True, kw_only=True):
    """One pool's numbers at the last evaluation (``None`` = not observed)."""

    name: Literal["shared", "ram", "vram"]
    capacity_bytes: int | None
    observed_used_bytes: int | None
    allocated_bytes: int
    reserved_bytes: int
    effective_used_bytes: int | None
    pressure: PressureLevel


def reservations_capability(
    participating: bool, uncovered: Mapping[str, str] | None = None
) -> CapabilityReport:
    """The host's ``runtime.memory.reservations`` row.

    :param participating: whether any loaded adapter supplies bounded byte requirements and
        advertises the reservation capability.
    :param uncovered: configured models whose start would *not* be reserved (model id →
        why). Any of them makes the row ``unavailable``: Werk does not claim to protect loads
        it does not account.
    """
    if participating and uncovered:
        shown = "; ".join(f"{model}: {why}" for model, why in sorted(uncovered.items())[:4])
        more = f" (and {len(uncovered) - 4} more)" if len(uncovered) > 4 else ""
        return CapabilityReport(
            id=_CAPABILITY,
            status=CapabilityStatus.UNAVAILABLE,
            reason=(
                "Werk reserves memory only for starts whose backend gives a bound; these "
                f"configured models would start unaccounted: {shown}{more}"
            ),
        )
    if participating:
        return CapabilityReport(
            id=_CAPABILITY,
            status=CapabilityStatus.SUPPORTED,
            operations=["reserve", "commit", "release"],
        )
    return CapabilityReport(
        id=_CAPABILITY,
        status=CapabilityStatus.UNAVAILABLE,
        reason=(
            "no loaded adapter supplies a bounded memory requirement; "
            "Werk does not claim to protect unaccounted backend loads"
        ),
    )
