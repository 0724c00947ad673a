"""``GET /metrics``: Prometheus text exposition (the ``prometheus_client`` package).

What is exported (every label is a route template, a method, a status class, a backend, a model,
a tier, a status, an event or a memory level — never a principal id, a state id, a prompt or a
path; an unrouted request is counted as route ``unmatched``):

* ``werk_http_requests_total{route,method,status_class}`` and
  ``werk_http_request_duration_seconds{route,method}`` (until the last body byte was sent);
* ``werk_runtime_starts_total`` / ``_crashes_total`` / ``_restarts_total{backend}``,
  ``werk_runtimes_loaded{backend}``;
* ``werk_states{tier,status}`` (every principal's disk and in-memory states);
* ``werk_handoffs_total{event}`` (``issued``, ``redeemed``, ``expired``, ``rejected``);
* ``werk_prefills_total{model}``, ``werk_prefill_prompt_tokens_total{model}``,
  ``werk_reused_tokens_total{model}`` (backend-reported),
  ``werk_state_restores_total{model,result}`` (``attempted``, ``verified``, ``refused``);
* ``werk_store_commit_duration_seconds``, ``werk_state_restore_duration_seconds`` (histograms);
* ``werk_memory_*``: the host pool, Werk's managed bytes, the pressure level (one-hot gauge
  ``werk_memory_pressure{level}``) and the accounting counters.

Access is the same as ``/werk/v1``'s (a bearer key when keys are configured); ``werk serve
--metrics-public`` also lets a **loopback** client scrape without a key.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

import anyio
from starlette.requests import Request
from starlette.responses import Response

from ..control.figures import LATENCY_BUCKETS, Histogram, HistogramSnapshot, ServiceFigures
from ..control.interface import WerkControl
from ..protocol import PressureLevel
from .auth import Authenticator
from .errors import error_response
from .guard import admit

if TYPE_CHECKING:  # prometheus_client is imported when /metrics is scraped, not at start-up
    from prometheus_client.core import Metric

__all__ = ["HttpMetrics", "metrics_endpoint"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The classic text format (what ``generate_latest`` writes; every Prometheus reads it)."""

_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
HTTP_BUCKETS = (0.001, 0.0025, *LATENCY_BUCKETS)
"""Seconds; a millisecond resolution at the bottom for the /v1 hop (issue 15's measure)."""


class HttpMetrics:
    """Request counts and latencies by route template (plain counters: nothing of
    ``prometheus_client`` is imported or touched on the request path)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str, str], int] = {}
        self._durations: dict[tuple[str, str], Histogram] = {}

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in _METHODS else "OTHER"
        key = (route, method, f"{status // 100}xx")
        with self._lock:
            self._requests[key] = self._requests.get(key, 0) + 1
            histogram = self._durations.get((route, method))
            if histogram is None:
                histogram = self._durations[(route, method)] = Histogram(HTTP_BUCKETS)
        histogram.observe(seconds)

    def snapshot(
        self,
    ) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], HistogramSnapshot]]:
        with self._lock:
            requests = dict(self._requests)
            durations = dict(self._durations)
        return requests, {key: h.snapshot() for key, h in durations.items()}


def _loopback_client(request: Request) -> bool:
    client = request.client
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


def metrics_endpoint(
    control: WerkControl, auth: Authenticator, http: HttpMetrics, *, public: bool
) -> Callable[[Request], Awaitable[Response]]:
    """The ``GET /metrics`` handler."""

    async def metrics(request: Request) -> Response:
        try:
            if not (public and _loopback_client(request)):
                admit(request, auth)
            figures = await control.figures()
            body = await anyio.to_thread.run_sync(render, http, figures)
        except Exception as exc:
            return error_response(request, exc)
        return Response(body, headers={"content-type": CONTENT_TYPE})

    return metrics


def render(http: HttpMetrics, figures: ServiceFigures) -> bytes:
    """The exposition text of the HTTP metrics and ``figures``."""
    from prometheus_client import CollectorRegistry, generate_latest

    families = list(_http(http)) + list(_figures(figures))

    class Snapshot:
        def collect(self) -> Iterator[Metric]:
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())
    return bytes(generate_latest(registry))


def _http(http: HttpMetrics) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    requests, durations = http.snapshot()
    counted = CounterMetricFamily(
        "werk_http_requests",
        "HTTP requests by route template, method and status class",
        labels=["route", "method", "status_class"],
    )
    for (route, method, status_class), n in sorted(requests.items()):
        counted.add_metric([route, method, status_class], n)
    yield counted
    timed = HistogramMetricFamily(
        "werk_http_request_duration_seconds",
        "HTTP request duration until the response ended, by route template and method",
        labels=["route", "method"],
    )
    for (route, method), snapshot in sorted(durations.items()):
        timed.add_metric([route, method], _buckets(snapshot), snapshot.total)
    yield timed


def _figures(f: ServiceFigures) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    yield from _runtimes(f)
    states = GaugeMetricFamily(
        "werk_states",
        "Named states by tier and status (all principals)",
        labels=["tier", "status"],
    )
    for (tier, status), n in sorted(f.states.items()):
        states.add_metric([tier, status], n)
    yield states
    handoffs = CounterMetricFamily(
        "werk_handoffs", "Prefill/decode handoffs by event", labels=["event"]
    )
    for event, n in sorted(f.handoffs.items()):
        handoffs.add_metric([event], n)
    yield handoffs
    yield from _reuse(f)
    yield _histogram(
        "werk_store_commit_duration_seconds",
        "Commits of named states to the disk store",
        f.commit_seconds,
    )
    yield _histogram(
        "werk_state_restore_duration_seconds",
        "Restores of stored states into a backend (verify, copy, backend restore)",
        f.restore_seconds,
    )
    yield from _memory(f)


def _runtimes(f: ServiceFigures) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for event, text in (
        ("starts", "Runtime starts"),
        ("crashes", "Runtimes found dead without being stopped"),
        ("restarts", "Starts that replaced an earlier runtime of the model"),
    ):
        family = CounterMetricFamily(f"werk_runtime_{event}", text, labels=["backend"])
        for backend, counts in sorted(f.runtime_events.items()):
            family.add_metric([backend], counts.get(event, 0))
        yield family
    loaded = GaugeMetricFamily("werk_runtimes_loaded", "Loaded runtimes", labels=["backend"])
    for backend, n in sorted(f.loaded_runtimes.items()):
        loaded.add_metric([backend], n)
    yield loaded


def _reuse(f: ServiceFigures) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily

    prefills = CounterMetricFamily("werk_prefills", "Prefills", labels=["model"])
    prompt = CounterMetricFamily(
        "werk_prefill_prompt_tokens", "Prompt tokens of prefills", labels=["model"]
    )
    reused = CounterMetricFamily(
        "werk_reused_tokens",
        "Prompt tokens the backend reported as reused from a named state",
        labels=["model"],
    )
    restores = CounterMetricFamily(
        "werk_state_restores", "Restores of named states by result", labels=["model", "result"]
    )
    for model, m in sorted(f.reuse.items()):
        prefills.add_metric([model], m.prefills)
        prompt.add_metric([model], m.prompt_tokens)
        reused.add_metric([model], m.cached_tokens)
        restores.add_metric([model, "attempted"], m.restores.attempted)
        restores.add_metric([model, "verified"], m.restores.verified)
        restores.add_metric([model, "refused"], m.restores.refused)
    yield from (prefills, prompt, reused, restores)


def _buckets(snapshot: HistogramSnapshot) -> list[tuple[str, float]]:
    return [("+Inf" if b == float("inf") else repr(b), float(n)) for b, n in snapshot.buckets]


def _histogram(name: str, text: str, snapshot: HistogramSnapshot) -> Metric:
    from prometheus_client.core import HistogramMetricFamily

    family = HistogramMetricFamily(name, text)
    family.add_metric([], _buckets(snapshot), snapshot.total)
    return family


def _memory(f: ServiceFigures) -> Iterator[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    m = f.memory
    if m.host is not None:
        for part in ("total", "used", "available"):
            yield GaugeMetricFamily(
                f"werk_memory_host_{part}_bytes",
                f"Effective host memory ({part}; bounded by the cgroup)",
                value=getattr(m.host, f"{part}_bytes"),
            )
    yield GaugeMetricFamily(
        "werk_memory_managed_allocated_bytes",
        "Bytes Werk accounts for loaded runtimes",
        value=m.managed.allocated_bytes,
    )
    yield GaugeMetricFamily(
        "werk_memory_managed_reserved_bytes",
        "Bytes reserved for starts in progress",
        value=m.managed.reserved_bytes,
    )
    level = GaugeMetricFamily(
        "werk_memory_pressure",
        "The memory pressure level (1 for the current one)",
        labels=["level"],
    )
    for candidate in PressureLevel:
        level.add_metric([candidate.value], 1 if candidate is m.pressure else 0)
    yield level
    c = m.counters
    yield CounterMetricFamily(
        "werk_memory_failed_releases", "Backend releases that failed", value=c.failed_releases
    )
    yield GaugeMetricFamily(
        "werk_memory_orphaned_release_bytes",
        "Bytes of allocations whose last release failed",
        value=c.orphaned_release_bytes,
    )
    yield CounterMetricFamily(
        "werk_memory_telemetry_errors", "Failed memory samples", value=c.telemetry_errors
    )
    yield CounterMetricFamily(
        "werk_memory_backend_cleanup_failures",
        "Backend cleanup failures",
        value=c.backend_cleanup_failures,
    )
    yield GaugeMetricFamily(
        "werk_memory_backend_cleanup_latched",
        "1 after a latched backend cleanup failure",
        value=c.backend_cleanup_latched,
    )
