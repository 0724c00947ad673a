"""What ``/metrics`` exposes, gathered by the control service (no Prometheus types here).

Labels never carry a principal id, a state id, a prompt or a path: runtime events are per
backend, states per tier and status, reuse per model.
"""

from __future__ import annotations

import bisect
import threading

import msgspec

from ..protocol.memory import MemoryResponse
from ..protocol.stats import ModelReuse

__all__ = ["LATENCY_BUCKETS", "Histogram", "HistogramSnapshot", "ServiceFigures"]

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds; Prometheus' default buckets extended to a minute (large state commits)."""


class HistogramSnapshot(msgspec.Struct, frozen=True):
    """Cumulative counts per upper bound (the last bound is ``+Inf``), the sum and the count."""

    buckets: tuple[tuple[float, int], ...]
    total: float
    count: int


class Histogram:
    """A thread-safe latency histogram with fixed buckets."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self._counts[bisect.bisect_left(self._bounds, seconds)] += 1
            self._sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        with self._lock:
            cumulative, running = [], 0
            for bound, n in zip((*self._bounds, float("inf")), self._counts, strict=True):
                running += n
                cumulative.append((bound, running))
            return HistogramSnapshot(tuple(cumulative), self._sum, running)


class ServiceFigures(msgspec.Struct, frozen=True):
    """One consistent read of everything ``/metrics`` reports besides HTTP traffic.

    :ivar runtime_events: per backend, ``starts``, ``crashes`` (found dead) and ``restarts``
        (a start that replaced a dead or changed runtime).
    :ivar states: ``(tier, status)`` → count, every principal's disk states and volatile ones.
    :ivar handoffs: ``issued``, ``redeemed``, ``expired``, ``rejected``.
    :ivar reuse: per model, summed over principals (backend-reported counts).
    :ivar commit_seconds: state commits to the disk store; :ivar restore_seconds: restores of
        a stored state into a backend.
    :ivar memory: the memory snapshot (pool, pressure, accounting counters).
    """

    runtime_events: dict[str, dict[str, int]]
    states: dict[tuple[str, str], int]
    handoffs: dict[str, int]
    reuse: dict[str, ModelReuse]
    commit_seconds: HistogramSnapshot
    restore_seconds: HistogramSnapshot
    memory: MemoryResponse
    loaded_runtimes: dict[str, int] = msgspec.field(default_factory=dict)
