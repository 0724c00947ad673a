"""Thresholds, downward hysteresis and the action cooldown (unit + hypothesis properties)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from werk.memory.pressure import (
    ACTION_COOLDOWN_S,
    EMERGENCY_THRESHOLD,
    HARD_THRESHOLD,
    HYSTERESIS,
    SEVERITY,
    SOFT_THRESHOLD,
    Cooldown,
    classify,
    next_level,
    utilisation,
    worst,
)
from werk.protocol.memory import PressureLevel as P

pct = st.integers(min_value=0, max_value=10_000).map(lambda bp: Fraction(bp, 10_000))
levels = st.sampled_from([P.NORMAL, P.SOFT, P.HARD, P.EMERGENCY])


def test_constants_are_the_documented_defaults() -> None:
    assert (
        Fraction(3, 4),
        Fraction(85, 100),
        Fraction(95, 100),
    ) == (SOFT_THRESHOLD, HARD_THRESHOLD, EMERGENCY_THRESHOLD)
    assert Fraction(5, 100) == HYSTERESIS
    assert ACTION_COOLDOWN_S == 5.0


@pytest.mark.parametrize(
    ("used", "level"),
    [
        (0, P.NORMAL),
        (749, P.NORMAL),
        (750, P.SOFT),
        (849, P.SOFT),
        (850, P.HARD),
        (949, P.HARD),
        (950, P.EMERGENCY),
        (1000, P.EMERGENCY),
        (1200, P.EMERGENCY),
    ],
)
def test_classify_boundaries(used: int, level: P) -> None:
    assert classify(utilisation(used, 1000)) is level


def test_hysteresis_walkthrough() -> None:
    level = next_level(None, Fraction(86, 100))
    assert level is P.HARD
    assert next_level(level, Fraction(81, 100)) is P.HARD  # inside the 5 pp band
    assert next_level(level, Fraction(80, 100)) is P.HARD  # exactly 5 pp below: still inside
    assert next_level(level, Fraction(7999, 10000)) is P.SOFT
    assert next_level(P.EMERGENCY, Fraction(60, 100)) is P.NORMAL  # several levels at once
    assert next_level(P.EMERGENCY, Fraction(72, 100)) is P.SOFT
    assert next_level(P.NORMAL, Fraction(96, 100)) is P.EMERGENCY  # rising is immediate
    assert next_level(P.UNKNOWN, Fraction(80, 100)) is P.SOFT


def test_utilisation_rejects_unknown_capacity() -> None:
    with pytest.raises(ValueError, match="positive"):
        utilisation(1, 0)


def test_worst() -> None:
    assert worst([P.NORMAL, P.HARD, P.SOFT]) is P.HARD
    assert worst([P.NORMAL, P.UNKNOWN]) is P.UNKNOWN
    assert worst([]) is P.UNKNOWN


@given(current=st.one_of(st.none(), levels), value=pct)
def test_level_is_bracketed_by_fresh_and_banded_classification(
    current: P | None, value: Fraction
) -> None:
    result = next_level(current, value)
    assert SEVERITY[classify(value)] <= SEVERITY[result] <= SEVERITY[classify(value + HYSTERESIS)]
    if current is not None:
        # never rises above what the value alone demands, never falls by hysteresis alone
        assert SEVERITY[result] <= max(SEVERITY[current], SEVERITY[classify(value)])


@given(start=pct, wiggles=st.lists(pct, min_size=1, max_size=50))
def test_no_flapping_inside_the_band(start: Fraction, wiggles: list[Fraction]) -> None:
    """After entering a level, oscillating anywhere in [threshold - 5 pp, ...) never leaves it
    downward, and staying below the next threshold never raises it."""
    level = next_level(None, start)
    thresholds = {P.SOFT: SOFT_THRESHOLD, P.HARD: HARD_THRESHOLD, P.EMERGENCY: EMERGENCY_THRESHOLD}
    low = Fraction(0) if level is P.NORMAL else thresholds[level] - HYSTERESIS
    above = [t for lvl, t in thresholds.items() if SEVERITY[lvl] > SEVERITY[level]]
    high = min(above) if above else Fraction(2)
    history = [level]
    for w in wiggles:
        value = low + (high - low) * w * Fraction(9999, 10000)  # inside [low, high)
        level = next_level(level, value)
        history.append(level)
    assert len(set(history)) == 1


@given(values=st.lists(pct, min_size=2, max_size=60))
def test_changes_need_a_real_move(values: list[Fraction]) -> None:
    """Every downward change is justified by a value >= 5 pp below the left level's threshold."""
    thresholds = {P.SOFT: SOFT_THRESHOLD, P.HARD: HARD_THRESHOLD, P.EMERGENCY: EMERGENCY_THRESHOLD}
    level = next_level(None, values[0])
    for value in values[1:]:
        new = next_level(level, value)
        if SEVERITY[new] < SEVERITY[level]:
            assert value < thresholds[level] - HYSTERESIS
        if SEVERITY[new] > SEVERITY[level]:
            assert value >= thresholds[new]
        level = new


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_cooldown_with_injected_clock() -> None:
    clock = _Clock()
    cooldown = Cooldown()
    assert cooldown.ready(clock()) and cooldown.last_action_at is None
    assert cooldown.try_acquire(clock())
    clock.now += 4.999
    assert not cooldown.ready(clock()) and not cooldown.try_acquire(clock())
    clock.now += 0.001
    assert cooldown.try_acquire(clock())
    assert cooldown.last_action_at == clock.now


@given(gaps=st.lists(st.floats(min_value=0, max_value=20, allow_nan=False), max_size=40))
def test_cooldown_spacing_property(gaps: list[float]) -> None:
    now = 0.0
    cooldown = Cooldown()
    acquired: list[float] = []
    for gap in gaps:
        now += gap
        if cooldown.try_acquire(now):
            acquired.append(now)
    assert all(b - a >= ACTION_COOLDOWN_S for a, b in itertools.pairwise(acquired))
