"""The pressure-relief planner: one bounded pass after a denied reservation (pure).

Given the memory pool's effective use, the denied request, and candidate states supplied by the
caller, :func:`plan_relief` chooses actions so that the **projected** utilisation — effective use
plus the requested bytes, minus what the chosen actions free — falls below the *hard* threshold
(85 %), even when the pool's pressure before the request was only normal or soft.

Rules, in order:

1. Nothing is planned while the action cooldown runs (5 s after the previous pass); the
   candidates that rule 2 excludes are still reported as skipped.
2. Pinned candidates, candidates with a live handoff, candidates in use (a loaded runtime with
   a request in flight) and candidates whose freed size is unknown (or zero) are never
   selected; they are reported as skipped with the reason.
3. Demotions come first, least recently used first; evictions (of candidates that cannot be
   demoted) only afterwards, again least recently used first.
4. Planning stops as soon as the projection is below the target, and never exceeds
   ``max_actions`` actions.

A candidate's ``bytes`` is what its action frees *in the pool under pressure* (on a unified
system a demotion from VRAM to RAM frees nothing, so the caller lists only demotions to a tier
outside the pool). The planner executes nothing; the memory manager runs the actions through
callbacks and then retries the reservation once.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from fractions import Fraction

import msgspec

from .pressure import ACTION_COOLDOWN_S, HARD_THRESHOLD, utilisation

__all__ = [
    "MAX_RELIEF_ACTIONS",
    "ReliefAction",
    "ReliefCandidate",
    "ReliefKind",
    "ReliefPlan",
    "plan_relief",
]

MAX_RELIEF_ACTIONS = 8
"""Default per-cycle bound on relief actions."""


class ReliefKind(enum.StrEnum):
    DEMOTE = "demote"
    EVICT = "evict"


class ReliefCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """A state the caller could demote or evict.

    :ivar id: the state's id (equal to the owner of its memory allocation, if any).
    :ivar bytes: bytes its action would free in the pressured pool; ``None`` when unknown.
    :ivar last_used: monotonic time of last use (smaller = less recently used).
    :ivar pinned: pinned by the user, or by the manager after a failed release.
    :ivar live_handoff: a live handoff refers to it; moving it would break the handoff.
    :ivar in_use: work is in progress on it (a runtime serving a request or a stream).
    :ivar can_demote: a lower tier can take it (otherwise only eviction frees it).
    """

    id: str
    bytes: int | None
    last_used: float
    pinned: bool = False
    live_handoff: bool = False
    in_use: bool = False
    can_demote: bool = False


class ReliefAction(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: ReliefKind
    bytes: int


class ReliefPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of planning.

    :ivar actions: in execution order.
    :ivar skipped: ``(candidate id, reason)`` for candidates that were not selectable.
    :ivar projected_before: utilisation with the request, before any action.
    :ivar projected_after: utilisation with the request, after all planned actions.
    :ivar reached_target: ``projected_after`` is below the hard threshold.
    :ivar reason: why nothing (or not enough) was planned, if so.
    """

    actions: tuple[ReliefAction, ...]
    skipped: tuple[tuple[str, str], ...]
    projected_before: Fraction
    projected_after: Fraction
    reached_target: bool
    reason: str | None = None


def _below_target(used: int, total: int) -> bool:
    return utilisation(used, total) < HARD_THRESHOLD


def plan_relief(
    *,
    used: int,
    requested: int,
    total: int,
    candidates: Sequence[ReliefCandidate],
    now: float,
    last_action_at: float | None,
    max_actions: int = MAX_RELIEF_ACTIONS,
    cooldown_s: float = ACTION_COOLDOWN_S,
) -> ReliefPlan:
    """Plan one bounded relief pass (see the module docstring for the rules).

    :param used: the pool's effective use now (observed or managed, plus pending reservations).
    :param requested: the bytes of the denied reservation (included in the projection).
    :param total: the pool's capacity (positive).
    :param now: the monotonic clock now; ``last_action_at`` the previous pass, if any.
    :raises ValueError: for a non-positive capacity or action bound, or negative byte counts.
    """
    if total <= 0:
        raise ValueError("capacity must be positive")
    if max_actions < 1:
        raise ValueError("the action bound must be at least 1")
    if used < 0 or requested < 0:
        raise ValueError("byte counts must not be negative")
    projected = used + requested
    before = utilisation(projected, total)
    if _below_target(projected, total):
        return ReliefPlan(
            actions=(),
            skipped=(),
            projected_before=before,
            projected_after=before,
            reached_target=True,
            reason="projected utilisation is already below the hard threshold",
        )
    skipped: list[tuple[str, str]] = []
    eligible: list[ReliefCandidate] = []
    seen: set[str] = set()
    for candidate in candidates:
        if candidate.id in seen:
            skipped.append((candidate.id, "duplicate candidate"))
            continue
        seen.add(candidate.id)
        if candidate.pinned:
            skipped.append((candidate.id, "pinned"))
        elif candidate.live_handoff:
            skipped.append((candidate.id, "live handoff"))
        elif candidate.in_use:
            skipped.append((candidate.id, "in use"))
        elif candidate.bytes is None:
            skipped.append((candidate.id, "size unknown"))
        elif candidate.bytes <= 0:
            skipped.append((candidate.id, "frees nothing"))
        else:
            eligible.append(candidate)
    if last_action_at is not None and now - last_action_at < cooldown_s:
        return ReliefPlan(
            actions=(),
            skipped=tuple(skipped),
            projected_before=before,
            projected_after=before,
            reached_target=False,
            reason="action cooldown in effect",
        )
    demotions = sorted((c for c in eligible if c.can_demote), key=lambda c: (c.last_used, c.id))
    evictions = sorted((c for c in eligible if not c.can_demote), key=lambda c: (c.last_used, c.id))
    ordered = [(c, ReliefKind.DEMOTE) for c in demotions] + [
        (c, ReliefKind.EVICT) for c in evictions
    ]
    actions: list[ReliefAction] = []
    reason: str | None = None
    for position, (candidate, kind) in enumerate(ordered):
        if _below_target(projected, total):
            break
        if len(actions) >= max_actions:
            skipped.extend((c.id, "action bound reached") for c, _ in ordered[position:])
            reason = f"action bound of {max_actions} reached"
            break
        assert candidate.bytes is not None
        actions.append(ReliefAction(id=candidate.id, kind=kind, bytes=candidate.bytes))
        projected = max(0, projected - candidate.bytes)
    reached = _below_target(projected, total)
    if not reached and reason is None:
        reason = "not enough eligible candidates to fall below the hard threshold"
    return ReliefPlan(
        actions=tuple(actions),
        skipped=tuple(skipped),
        projected_before=before,
        projected_after=utilisation(projected, total),
        reached_target=reached,
        reason=reason,
    )
