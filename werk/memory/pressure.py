"""Pressure levels: thresholds, downward hysteresis and the action cooldown.

Utilisation is an exact :class:`fractions.Fraction` (``used / total``), so a threshold test never
depends on floating-point rounding. The policy constants are internal defaults (seed: "Dynamic
memory accounting"), deliberately **not** an environment-variable interface:

* ``soft`` from 75 %, ``hard`` from 85 %, ``emergency`` from 95 % utilisation (rising edges take
  effect immediately);
* a level is left downwards only once utilisation is 5 percentage points below the threshold
  that entered it (so utilisation oscillating inside a 5 pp band never flaps the level);
* at most one pressure-relief action pass per 5 seconds (:class:`Cooldown`).
"""

from __future__ import annotations

import threading
from fractions import Fraction

from ..protocol.memory import PressureLevel

__all__ = [
    "ACTION_COOLDOWN_S",
    "EMERGENCY_THRESHOLD",
    "HARD_THRESHOLD",
    "HYSTERESIS",
    "SEVERITY",
    "SOFT_THRESHOLD",
    "Cooldown",
    "classify",
    "next_level",
    "utilisation",
    "worst",
]

SOFT_THRESHOLD = Fraction(75, 100)
HARD_THRESHOLD = Fraction(85, 100)
EMERGENCY_THRESHOLD = Fraction(95, 100)
HYSTERESIS = Fraction(5, 100)
ACTION_COOLDOWN_S = 5.0

SEVERITY: dict[PressureLevel, int] = {
    PressureLevel.NORMAL: 0,
    PressureLevel.SOFT: 1,
    PressureLevel.HARD: 2,
    PressureLevel.EMERGENCY: 3,
}
"""Order of the known levels; ``unknown`` has no severity."""

_BY_SEVERITY = {value: level for level, value in SEVERITY.items()}


def utilisation(used: int, total: int) -> Fraction:
    """``used / total`` exactly. ``total`` must be positive."""
    if total <= 0:
        raise ValueError("capacity must be positive to compute utilisation")
    return Fraction(max(0, used), total)


def classify(value: Fraction) -> PressureLevel:
    """The level for a utilisation without history (rising thresholds only)."""
    if value >= EMERGENCY_THRESHOLD:
        return PressureLevel.EMERGENCY
    if value >= HARD_THRESHOLD:
        return PressureLevel.HARD
    if value >= SOFT_THRESHOLD:
        return PressureLevel.SOFT
    return PressureLevel.NORMAL


def next_level(current: PressureLevel | None, value: Fraction) -> PressureLevel:
    """The level after observing ``value`` while at ``current``.

    Rising: ``classify(value)``. Falling: only as far as ``classify(value + HYSTERESIS)``, i.e. a
    level is kept until utilisation drops 5 pp below its entry threshold. ``current`` of
    ``None`` or ``unknown`` (no history) classifies afresh.
    """
    fresh = classify(value)
    if current is None or current is PressureLevel.UNKNOWN:
        return fresh
    sticky = min(SEVERITY[current], SEVERITY[classify(value + HYSTERESIS)])
    return _BY_SEVERITY[max(SEVERITY[fresh], sticky)]


def worst(levels: list[PressureLevel]) -> PressureLevel:
    """The most severe level; ``unknown`` if any is unknown or the list is empty."""
    if not levels or any(level is PressureLevel.UNKNOWN for level in levels):
        return PressureLevel.UNKNOWN
    return max(levels, key=lambda level: SEVERITY[level])


class Cooldown:
    """At most one action per ``period_s`` of an injected monotonic clock. Thread-safe."""

    def __init__(self, period_s: float = ACTION_COOLDOWN_S) -> None:
        self.period_s = period_s
        self._last: float | None = None
        self._lock = threading.Lock()

    @property
    def last_action_at(self) -> float | None:
        with self._lock:
            return self._last

    def ready(self, now: float) -> bool:
        """Whether an action may start at ``now``."""
        with self._lock:
            return self._last is None or now - self._last >= self.period_s

    def try_acquire(self, now: float) -> bool:
        """Start an action at ``now`` if the cooldown allows it (atomically check and mark)."""
        with self._lock:
            if self._last is not None and now - self._last < self.period_s:
                return False
            self._last = now
            return True
