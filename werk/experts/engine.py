"""The backend-neutral expert policy engine (seed: "Expert-residency boundary").

One engine per model. It keeps what the backend observed — stable expert ids, their tier
(``vram`` > ``ram`` > ``external``) and, when known, their size — plus policy metadata:

* **hotness**: an exponentially decaying access score. An access adds its weight to the score
  decayed to now; without accesses the score only falls, halving every ``half_life_s`` of the
  injected monotonic clock.
* **pins**: a pinned expert is never planned for any movement.
* **transition cooldowns**: an expert that changed tier less than ``transition_cooldown_s`` ago
  is not planned again (this damps thrashing).
* **claims**: backend work on an expert is claimed first; a claimed expert cannot be claimed or
  planned again until the claim completes or is aborted.

Plans are bounded (``max_actions``). A *prefetch* plan raises experts to a higher tier, hottest
first, optionally within a byte budget of the target tier; an *evict* plan lowers them, coldest
first, optionally until a number of bytes is freed. An unknown size stays ``None``: it is never
counted as fitting a budget, nor as freeing bytes.

The engine moves nothing. The host claims the planned ids, asks the adapter's
``werk_move_experts`` hook to move them, and calls :meth:`ExpertEngine.complete` with the ids the
adapter reports moved; only those change tier. A failed or partial move leaves the others as
they were.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import msgspec

from ..backends import ExpertObservation
from ..protocol.errors import Conflict, InvalidRequest, NotFound, ResourceExhausted
from ..protocol.residency import (
    ExpertAction,
    ExpertActionResult,
    ExpertInfo,
    ExpertList,
    ExpertSkip,
    ExpertTier,
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

DEFAULT_HALF_LIFE_S = 60.0
DEFAULT_TRANSITION_COOLDOWN_S = 5.0
DEFAULT_MAX_ACTIONS = 64
MAX_TRACKED_EXPERTS = 65536

TIER_RANK: dict[ExpertTier, int] = {ExpertTier.EXTERNAL: 0, ExpertTier.RAM: 1, ExpertTier.VRAM: 2}
"""Higher is faster/closer to compute."""


class StaleClaim(Conflict):
    """The claim is unknown, already completed or aborted."""


class PlannedMove(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    from_: ExpertTier
    to: ExpertTier
    nbytes: int | None


class ExpertPlan(msgspec.Struct, frozen=True, kw_only=True):
    """A bounded plan. ``skipped`` holds ``(id, reason)`` for every considered id not planned."""

    kind: Literal["prefetch", "evict"]
    target: ExpertTier
    moves: tuple[PlannedMove, ...]
    skipped: tuple[tuple[str, str], ...]

    @property
    def expert_ids(self) -> tuple[str, ...]:
        return tuple(move.id for move in self.moves)


class ExpertClaim(msgspec.Struct, frozen=True, kw_only=True):
    """Exclusive right to move ``expert_ids`` to ``target`` until completed or aborted."""

    id: str
    target: ExpertTier
    expert_ids: tuple[str, ...]


class ExpertCompletion(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`ExpertEngine.complete` changed.

    :ivar applied: moves recorded (the adapter reported them moved).
    :ivar not_moved: claimed ids the adapter did not report moved (metadata unchanged).
    :ivar ignored: ids the adapter reported that were not part of the claim (ignored).
    """

    applied: tuple[PlannedMove, ...]
    not_moved: tuple[str, ...]
    ignored: tuple[str, ...]


class _Expert(msgspec.Struct):
    id: str
    tier: ExpertTier
    nbytes: int | None
    score: float = 0.0
    scored_at: float = 0.0
    pinned: bool = False
    last_transition: float | None = None
    claim: str | None = None


class ExpertEngine:
    """Expert residency policy for one model (thread-safe).

    :param model: the model id (reported by :meth:`to_protocol`).
    :param clock: monotonic seconds.
    :param half_life_s: hotness half-life.
    :param transition_cooldown_s: minimum time between two tier changes of one expert.
    :param max_actions: default per-plan bound.
    """

    def __init__(
        self,
        model: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        half_life_s: float = DEFAULT_HALF_LIFE_S,
        transition_cooldown_s: float = DEFAULT_TRANSITION_COOLDOWN_S,
        max_actions: int = DEFAULT_MAX_ACTIONS,
    ) -> None:
        if not (half_life_s > 0 and math.isfinite(half_life_s)):
            raise ValueError("half_life_s must be positive and finite")
        if transition_cooldown_s < 0:
            raise ValueError("transition_cooldown_s must not be negative")
        if max_actions < 1:
            raise ValueError("max_actions must be at least 1")
        self.model = model
        self._clock = clock
        self._half_life_s = half_life_s
        self._cooldown_s = transition_cooldown_s
        self._max_actions = max_actions
        self._lock = threading.Lock()
        self._experts: dict[str, _Expert] = {}
        self._claims: dict[str, ExpertClaim] = {}

    # -- observations --------------------------------------------------------------------------

    def observe(self, observations: Iterable[ExpertObservation], *, complete: bool = False) -> None:
        """Record backend observations (the backend is the truth about tiers and sizes).

        A tier different from the recorded one counts as a transition (cooldown starts).
        ``complete=True`` means the observations list every expert: unlisted, unclaimed experts
        are forgotten.

        :raises werk.InvalidRequest: an empty/overlong id or a negative size.
        :raises werk.ResourceExhausted: more than :data:`MAX_TRACKED_EXPERTS` experts.
        """
        batch = list(observations)
        for obs in batch:
            if not obs.id or len(obs.id) > 256:
                raise InvalidRequest("expert ids are 1..256 characters")
            if obs.nbytes is not None and (
                not isinstance(obs.nbytes, int) or isinstance(obs.nbytes, bool) or obs.nbytes < 0
            ):
                raise InvalidRequest(f"expert {obs.id!r} has an invalid size")
            if obs.tier not in TIER_RANK:
                raise InvalidRequest(f"expert {obs.id!r} has an unknown tier {obs.tier!r}")
        with self._lock:
            now = self._clock()
            new_ids = {obs.id for obs in batch} - self._experts.keys()
            if len(self._experts) + len(new_ids) > MAX_TRACKED_EXPERTS:
                raise ResourceExhausted(f"more than {MAX_TRACKED_EXPERTS} experts observed")
            for obs in batch:
                expert = self._experts.get(obs.id)
                if expert is None:
                    self._experts[obs.id] = _Expert(
                        id=obs.id, tier=obs.tier, nbytes=obs.nbytes, scored_at=now
                    )
                    continue
                if expert.tier != obs.tier:
                    expert.tier = obs.tier
                    expert.last_transition = now
                expert.nbytes = obs.nbytes
            if complete:
                listed = {obs.id for obs in batch}
                for expert_id in [
                    e.id for e in self._experts.values() if e.id not in listed and e.claim is None
                ]:
                    del self._experts[expert_id]

    def record_access(self, expert_id: str, *, weight: float = 1.0) -> bool:
        """Add an access event; ``False`` (and no change) for an expert never observed."""
        if not (weight >= 0 and math.isfinite(weight)):
            raise InvalidRequest("an access weight is a finite non-negative number")
        with self._lock:
            expert = self._experts.get(expert_id)
            if expert is None:
                return False
            now = self._clock()
            expert.score = self._decayed(expert, now) + weight
            expert.scored_at = max(now, expert.scored_at)
            return True

    def hotness(self, expert_id: str) -> float:
        """The decayed score now.

        :raises werk.NotFound: unknown expert.
        """
        with self._lock:
            return self._decayed(self._get(expert_id), self._clock())

    def pin(self, expert_id: str, pinned: bool = True) -> None:
        """Pin (or unpin) an expert: a pinned expert is never planned for movement."""
        with self._lock:
            self._get(expert_id).pinned = pinned

    def to_protocol(self) -> ExpertList:
        """``GET /werk/v1/experts?model=ID`` body, experts sorted by id."""
        with self._lock:
            now = self._clock()
            return ExpertList(
                model=self.model,
                experts=[
                    ExpertInfo(
                        id=e.id,
                        tier=e.tier,
                        bytes=e.nbytes,
                        hotness=self._decayed(e, now),
                        pinned=e.pinned,
                    )
                    for e in sorted(self._experts.values(), key=lambda e: e.id)
                ],
            )

    # -- planning ------------------------------------------------------------------------------

    def plan_prefetch(
        self,
        expert_ids: Sequence[str] | None,
        *,
        target: ExpertTier,
        budget_bytes: int | None = None,
        max_actions: int | None = None,
    ) -> ExpertPlan:
        """Plan raising experts to ``target``, hottest first.

        :param expert_ids: the experts asked for; ``None`` plans every expert below ``target``
            with a positive hotness.
        :param budget_bytes: free bytes Werk knows of in the target tier; when given, only
            experts of known size fitting the remaining budget are planned. ``None`` means Werk
            holds no budget for that tier (the adapter enforces its own bound).
        """
        if budget_bytes is not None and budget_bytes < 0:
            raise InvalidRequest("a budget is a non-negative byte count")
        with self._lock:
            now = self._clock()
            if expert_ids is None:
                expert_ids = [
                    e.id
                    for e in self._experts.values()
                    if TIER_RANK[e.tier] < TIER_RANK[target] and self._decayed(e, now) > 0
                ]
            considered, skipped = self._eligible(expert_ids, now, target, direction=1)
            considered.sort(key=lambda e: (-self._decayed(e, now), e.id))
            moves: list[PlannedMove] = []
            remaining = budget_bytes
            bound = max_actions or self._max_actions
            for expert in considered:
                if len(moves) >= bound:
                    skipped.append((expert.id, "action bound reached"))
                    continue
                if remaining is not None:
                    if expert.nbytes is None:
                        skipped.append(
                            (expert.id, "size unknown; not counted as fitting the target budget")
                        )
                        continue
                    if expert.nbytes > remaining:
                        skipped.append((expert.id, "does not fit the target tier budget"))
                        continue
                    remaining -= expert.nbytes
                moves.append(
                    PlannedMove(id=expert.id, from_=expert.tier, to=target, nbytes=expert.nbytes)
                )
            return ExpertPlan(
                kind="prefetch", target=target, moves=tuple(moves), skipped=tuple(skipped)
            )

    def plan_evict(
        self,
        expert_ids: Sequence[str] | None,
        *,
        target: ExpertTier,
        bytes_to_free: int | None = None,
        from_tier: ExpertTier | None = None,
        max_actions: int | None = None,
    ) -> ExpertPlan:
        """Plan lowering experts to ``target``, coldest first (pressure relief or a request).

        :param expert_ids: the experts asked for; ``None`` considers every expert above
            ``target`` (only those in ``from_tier`` when given).
        :param bytes_to_free: stop once planned known sizes add up to this; experts of unknown
            size are then skipped, since they cannot be counted as freeing anything.
        """
        if bytes_to_free is not None and bytes_to_free < 0:
            raise InvalidRequest("bytes_to_free is a non-negative byte count")
        with self._lock:
            now = self._clock()
            if expert_ids is None:
                expert_ids = [
                    e.id
                    for e in self._experts.values()
                    if TIER_RANK[e.tier] > TIER_RANK[target]
                    and (from_tier is None or e.tier == from_tier)
                ]
            considered, skipped = self._eligible(expert_ids, now, target, direction=-1)
            considered.sort(key=lambda e: (self._decayed(e, now), e.id))
            moves: list[PlannedMove] = []
            freed = 0
            bound = max_actions or self._max_actions
            for expert in considered:
                if bytes_to_free is not None and freed >= bytes_to_free:
                    break
                if len(moves) >= bound:
                    skipped.append((expert.id, "action bound reached"))
                    continue
                if bytes_to_free is not None:
                    if expert.nbytes is None:
                        skipped.append((expert.id, "size unknown; not counted as freeing bytes"))
                        continue
                    freed += expert.nbytes
                moves.append(
                    PlannedMove(id=expert.id, from_=expert.tier, to=target, nbytes=expert.nbytes)
                )
            return ExpertPlan(
                kind="evict", target=target, moves=tuple(moves), skipped=tuple(skipped)
            )

    # -- claims --------------------------------------------------------------------------------

    def claim(self, expert_ids: Sequence[str], *, target: ExpertTier) -> ExpertClaim:
        """Claim ``expert_ids`` for a move to ``target`` before any backend work (atomic).

        :raises werk.InvalidRequest: no ids, or duplicates.
        :raises werk.NotFound: an id was never observed.
        :raises werk.Conflict: an id is already claimed or pinned (nothing is claimed then).
        """
        ids = tuple(expert_ids)
        if not ids or len(set(ids)) != len(ids):
            raise InvalidRequest("a claim names one or more distinct experts")
        with self._lock:
            experts = [self._get(expert_id) for expert_id in ids]
            busy = [e.id for e in experts if e.claim is not None]
            if busy:
                raise Conflict(f"experts already claimed: {', '.join(busy[:8])}")
            pinned = [e.id for e in experts if e.pinned]
            if pinned:
                raise Conflict(f"experts pinned against movement: {', '.join(pinned[:8])}")
            claim = ExpertClaim(id="clm_" + secrets.token_hex(8), target=target, expert_ids=ids)
            for expert in experts:
                expert.claim = claim.id
            self._claims[claim.id] = claim
            return claim

    def claimed(self) -> frozenset[str]:
        """Ids under a live claim."""
        with self._lock:
            return frozenset(e.id for e in self._experts.values() if e.claim is not None)

    def complete(self, claim: ExpertClaim, moved_ids: Iterable[str]) -> ExpertCompletion:
        """Record the adapter's report: only ``moved_ids`` of the claim change tier.

        :raises StaleClaim: the claim is not live.
        """
        moved = set(moved_ids)
        with self._lock:
            self._take(claim)
            now = self._clock()
            applied: list[PlannedMove] = []
            not_moved: list[str] = []
            for expert_id in claim.expert_ids:
                expert = self._experts.get(expert_id)
                if expert is None:
                    continue
                expert.claim = None
                if expert_id not in moved:
                    not_moved.append(expert_id)
                    continue
                applied.append(
                    PlannedMove(
                        id=expert_id, from_=expert.tier, to=claim.target, nbytes=expert.nbytes
                    )
                )
                if expert.tier != claim.target:
                    expert.tier = claim.target
                    expert.last_transition = now
            ignored = sorted(moved - set(claim.expert_ids))
            return ExpertCompletion(
                applied=tuple(applied), not_moved=tuple(not_moved), ignored=tuple(ignored)
            )

    def abort(self, claim: ExpertClaim) -> None:
        """Give the claim up without any metadata change.

        :raises StaleClaim: the claim is not live.
        """
        with self._lock:
            self._take(claim)
            for expert_id in claim.expert_ids:
                expert = self._experts.get(expert_id)
                if expert is not None and expert.claim == claim.id:
                    expert.claim = None

    # -- protocol helpers ----------------------------------------------------------------------

    @staticmethod
    def result(
        plan: ExpertPlan, *, dry_run: bool, completion: ExpertCompletion | None = None
    ) -> ExpertActionResult:
        """``ExpertActionResult`` for a plan (dry run) or a plan and its completion."""
        skipped = [ExpertSkip(id=expert_id, reason=reason) for expert_id, reason in plan.skipped]
        applied: list[ExpertAction] = []
        if completion is not None:
            applied = [_action(move) for move in completion.applied]
            skipped.extend(
                ExpertSkip(id=expert_id, reason="the adapter did not report it moved")
                for expert_id in completion.not_moved
            )
        return ExpertActionResult(
            dry_run=dry_run,
            planned=[_action(move) for move in plan.moves],
            applied=applied,
            skipped=skipped,
        )

    # -- internals -----------------------------------------------------------------------------

    def _get(self, expert_id: str) -> _Expert:
        expert = self._experts.get(expert_id)
        if expert is None:
            raise NotFound(f"expert {expert_id!r} is not observed for model {self.model!r}")
        return expert

    def _take(self, claim: ExpertClaim) -> None:
        live = self._claims.get(claim.id)
        if live is None or live != claim:
            raise StaleClaim(f"claim {claim.id} is not live")
        del self._claims[claim.id]

    def _decayed(self, expert: _Expert, now: float) -> float:
        elapsed = max(0.0, now - expert.scored_at)
        return expert.score * math.pow(0.5, elapsed / self._half_life_s)

    def _eligible(
        self, expert_ids: Sequence[str], now: float, target: ExpertTier, *, direction: int
    ) -> tuple[list[_Expert], list[tuple[str, str]]]:
        """Split ids into plannable experts and ``(id, reason)`` skips (lock held)."""
        considered: list[_Expert] = []
        skipped: list[tuple[str, str]] = []
        seen: set[str] = set()
        for expert_id in expert_ids:
            if expert_id in seen:
                continue
            seen.add(expert_id)
            expert = self._experts.get(expert_id)
            if expert is None:
                skipped.append((expert_id, "not observed"))
            elif expert.pinned:
                skipped.append((expert_id, "pinned"))
            elif expert.claim is not None:
                skipped.append((expert_id, "claimed by another action"))
            elif (TIER_RANK[target] - TIER_RANK[expert.tier]) * direction <= 0:
                where = "above" if direction > 0 else "below"
                skipped.append((expert_id, f"target tier is not {where} its tier {expert.tier}"))
            elif (
                expert.last_transition is not None
                and now - expert.last_transition < self._cooldown_s
            ):
                skipped.append((expert_id, "transition cooldown"))
            else:
                considered.append(expert)
        return considered, skipped


def _action(move: PlannedMove) -> ExpertAction:
    return ExpertAction(id=move.id, from_=move.from_, to=move.to)
