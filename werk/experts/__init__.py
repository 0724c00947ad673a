"""Backend-neutral MoE expert residency policy (plans and claims; adapters move experts)."""

from .engine import (
    DEFAULT_HALF_LIFE_S,
    DEFAULT_MAX_ACTIONS,
    DEFAULT_TRANSITION_COOLDOWN_S,
    MAX_TRACKED_EXPERTS,
    TIER_RANK,
    ExpertClaim,
    ExpertCompletion,
    ExpertEngine,
    ExpertObservation,
    ExpertPlan,
    PlannedMove,
    StaleClaim,
)

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "DEFAULT_MAX_ACTIONS",
    "DEFAULT_TRANSITION_COOLDOWN_S",
    "MAX_TRACKED_EXPERTS",
    "TIER_RANK",
    "ExpertClaim",
    "ExpertCompletion",
    "ExpertEngine",
    "ExpertObservation",
    "ExpertPlan",
    "PlannedMove",
    "StaleClaim",
]
