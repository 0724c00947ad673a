"""The pure pressure-relief planner: unit cases and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from werk.memory.pressure import HARD_THRESHOLD, utilisation
from werk.memory.relief import ReliefCandidate, ReliefKind, plan_relief

GiB = 1 << 30


def cand(cid: str, size: int | None, last_used: float, **kw: bool) -> ReliefCandidate:
    return ReliefCandidate(id=cid, bytes=size, last_used=last_used, **kw)


def test_prefers_lru_demotions_then_lru_evictions() -> None:
    plan = plan_relief(
        used=9 * GiB,  # 90 % of 10 GiB
        requested=2 * GiB,  # projected 110 %
        total=10 * GiB,
        candidates=[
            cand("evict-old", GiB, 1.0),
            cand("demote-new", GiB, 50.0, can_demote=True),
            cand("demote-old", GiB, 10.0, can_demote=True),
            cand("evict-new", GiB, 60.0),
        ],
        now=100.0,
        last_action_at=None,
    )
    assert [(a.id, a.kind) for a in plan.actions] == [
        ("demote-old", ReliefKind.DEMOTE),
        ("demote-new", ReliefKind.DEMOTE),
        ("evict-old", ReliefKind.EVICT),
    ]
    # 11 - 3 = 8 GiB of 10: 80 % < 85 %; the fourth candidate is not touched
    assert plan.reached_target and plan.projected_after == utilisation(8 * GiB, 10 * GiB)


def test_targets_below_hard_even_from_normal_pressure() -> None:
    # before the request: 50 % (normal); with it: 90 % -> relief must act
    plan = plan_relief(
        used=5 * GiB,
        requested=4 * GiB,
        total=10 * GiB,
        candidates=[cand("a", GiB, 1.0, can_demote=True)],
        now=0.0,
        last_action_at=None,
    )
    assert [a.id for a in plan.actions] == ["a"]
    assert plan.projected_before == utilisation(9 * GiB, 10 * GiB)
    assert plan.projected_after < HARD_THRESHOLD


def test_skips_pinned_live_handoff_in_use_and_unknown_sizes() -> None:
    plan = plan_relief(
        used=9 * GiB,
        requested=GiB,
        total=10 * GiB,
        candidates=[
            cand("pinned", 5 * GiB, 0.0, pinned=True),
            cand("handoff", 5 * GiB, 0.0, live_handoff=True),
            cand("busy", 5 * GiB, 0.0, in_use=True),
            cand("unknown", None, 0.0),
            cand("empty", 0, 0.0),
        ],
        now=0.0,
        last_action_at=None,
    )
    assert plan.actions == ()
    assert dict(plan.skipped) == {
        "pinned": "pinned",
        "handoff": "live handoff",
        "busy": "in use",
        "unknown": "size unknown",
        "empty": "frees nothing",
    }
    assert not plan.reached_target and plan.reason is not None


def test_cooldown_blocks_a_second_pass() -> None:
    kwargs = dict(used=9 * GiB, requested=GiB, total=10 * GiB, candidates=[cand("a", GiB, 0.0)])
    blocked = plan_relief(**kwargs, now=104.0, last_action_at=100.0)  # type: ignore[arg-type]
    assert blocked.actions == () and blocked.reason == "action cooldown in effect"
    allowed = plan_relief(**kwargs, now=105.0, last_action_at=100.0)  # type: ignore[arg-type]
    assert [a.id for a in allowed.actions] == ["a"]


def test_action_bound_is_reported() -> None:
    plan = plan_relief(
        used=10 * GiB,
        requested=GiB,
        total=10 * GiB,
        candidates=[cand(f"c{i}", GiB // 8, float(i)) for i in range(40)],
        now=0.0,
        last_action_at=None,
        max_actions=3,
    )
    assert [a.id for a in plan.actions] == ["c0", "c1", "c2"]
    assert ("c3", "action bound reached") in plan.skipped
    assert plan.reason == "action bound of 3 reached"


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError, match="capacity"):
        plan_relief(used=0, requested=1, total=0, candidates=[], now=0, last_action_at=None)
    with pytest.raises(ValueError, match="bound"):
        plan_relief(
            used=0, requested=1, total=9, candidates=[], now=0, last_action_at=None, max_actions=0
        )


candidates_st = st.lists(
    st.builds(
        ReliefCandidate,
        id=st.text(alphabet="abcdefgh", min_size=1, max_size=3),
        bytes=st.one_of(st.none(), st.integers(min_value=0, max_value=4000)),
        last_used=st.floats(min_value=0, max_value=1000, allow_nan=False),
        pinned=st.booleans(),
        live_handoff=st.booleans(),
        in_use=st.booleans(),
        can_demote=st.booleans(),
    ),
    max_size=30,
)


@given(
    candidates=candidates_st,
    used=st.integers(min_value=0, max_value=20_000),
    requested=st.integers(min_value=1, max_value=10_000),
    total=st.integers(min_value=1, max_value=20_000),
    max_actions=st.integers(min_value=1, max_value=10),
    since_last=st.one_of(st.none(), st.floats(min_value=0, max_value=10, allow_nan=False)),
)
def test_planner_properties(
    candidates: list[ReliefCandidate],
    used: int,
    requested: int,
    total: int,
    max_actions: int,
    since_last: float | None,
) -> None:
    now = 1000.0
    last = None if since_last is None else now - since_last
    plan = plan_relief(
        used=used,
        requested=requested,
        total=total,
        candidates=candidates,
        now=now,
        last_action_at=last,
        max_actions=max_actions,
    )
    by_id: dict[str, ReliefCandidate] = {}
    for c in candidates:
        by_id.setdefault(c.id, c)
    chosen = [by_id[a.id] for a in plan.actions]
    # never pinned, never a live handoff, never in use, never unknown size, never twice
    assert not any(c.pinned or c.live_handoff or c.in_use or c.bytes is None for c in chosen)
    assert len({a.id for a in plan.actions}) == len(plan.actions)
    # the action bound holds; nothing while the cooldown runs
    assert len(plan.actions) <= max_actions
    if last is not None and now - last < 5.0:
        assert plan.actions == ()
    # demotions strictly before evictions, each group least recently used first
    kinds = [a.kind for a in plan.actions]
    assert kinds == sorted(kinds, key=lambda k: k is ReliefKind.EVICT)
    for kind in ReliefKind:
        group = [by_id[a.id].last_used for a in plan.actions if a.kind is kind]
        assert group == sorted(group)
    # projection includes the request; stops as soon as it is below hard
    projected = used + requested
    assert plan.projected_before == utilisation(projected, total)
    for i, action in enumerate(plan.actions):
        assert utilisation(projected, total) >= HARD_THRESHOLD, f"action {i} was unnecessary"
        projected = max(0, projected - action.bytes)
    assert plan.projected_after == utilisation(projected, total)
    assert plan.reached_target == (plan.projected_after < HARD_THRESHOLD)
