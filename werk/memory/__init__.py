"""Memory telemetry, accounting, admission control and pressure relief (backend-neutral).

* :mod:`.telemetry` and :mod:`.cgroup` — what the host and the accelerators report;
* :mod:`.pressure` — thresholds, hysteresis, cooldown;
* :mod:`.relief` — the pure pressure-relief planner;
* :mod:`.manager` — :class:`MemoryManager`, reservations and the ``GET /werk/v1/memory`` body.
"""

from .cgroup import CgroupBudget, CgroupReadError, read_cgroup_budget
from .manager import (
    Allocation,
    MemoryManager,
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
from .pressure import (
    ACTION_COOLDOWN_S,
    EMERGENCY_THRESHOLD,
    HARD_THRESHOLD,
    HYSTERESIS,
    SOFT_THRESHOLD,
    Cooldown,
    classify,
    next_level,
)
from .relief import (
    MAX_RELIEF_ACTIONS,
    ReliefAction,
    ReliefCandidate,
    ReliefKind,
    ReliefPlan,
    plan_relief,
)
from .telemetry import (
    AcceleratorSample,
    HostBudget,
    TelemetryError,
    effective_host,
    is_apple_silicon,
    sample_accelerators,
    sample_host,
    sample_host_budget,
)

__all__ = [
    "ACTION_COOLDOWN_S",
    "EMERGENCY_THRESHOLD",
    "HARD_THRESHOLD",
    "HYSTERESIS",
    "MAX_RELIEF_ACTIONS",
    "SOFT_THRESHOLD",
    "AcceleratorSample",
    "Allocation",
    "CgroupBudget",
    "CgroupReadError",
    "Cooldown",
    "HostBudget",
    "MemoryManager",
    "MemoryTier",
    "PoolView",
    "ReliefAction",
    "ReliefCallbacks",
    "ReliefCandidate",
    "ReliefKind",
    "ReliefPlan",
    "ReliefReport",
    "Reservation",
    "ReservationMismatch",
    "ReservationTooLarge",
    "StaleReservation",
    "TelemetryError",
    "classify",
    "effective_host",
    "is_apple_silicon",
    "next_level",
    "plan_relief",
    "read_cgroup_budget",
    "reservations_capability",
    "sample_accelerators",
    "sample_host",
    "sample_host_budget",
]
