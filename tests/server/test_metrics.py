"""``GET /metrics`` on a real ``werk serve`` (testkv backend): valid Prometheus exposition
(parsed by ``prometheus_client``'s own parser), counters that move as requests are made, the
same authentication as ``/werk/v1`` (401 without the key), ``--metrics-public`` for a loopback
scrape, and no principal id, state id or prompt in any label."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from _server import WerkServer
from prometheus_client.parser import text_string_to_metric_families

KEY = "metrics-key-0123456789abcdef"
P = "/werk/v1"
DISK_PREFER = {"retention": "disk", "reuse": "prefer"}
PROMPT = "alpha beta gamma"


def scrape(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def prefill(client: httpx.Client) -> dict[str, Any]:
    body = {"model": "kv", "prompt": PROMPT, "allow_experimental": True, "policy": DISK_PREFER}
    response = client.post(f"{P}/prefill", json=body)
    assert response.status_code == 200, response.text
    made: dict[str, Any] = response.json()
    return made


def test_metrics_need_the_key_and_move_with_requests(
    spawn_server: Callable[..., WerkServer],
) -> None:
    server = spawn_server(keys=[KEY])
    with server.client() as anonymous:
        denied = anonymous.get("/metrics")
        assert denied.status_code == 401
        assert denied.json()["error"]["code"] == "unauthenticated"
    with server.client(KEY) as client:
        before = scrape(client)
        first = prefill(client)
        again = prefill(client)  # reuses the first one's disk state
        decoded = client.post(f"{P}/decode", json={"handoff": first["handoff"]["token"]})
        assert decoded.status_code == 200, decoded.text
        bogus = client.post(f"{P}/decode", json={"handoff": first["handoff"]["token"]})
        assert bogus.status_code == 410  # spent: a rejected handoff
        assert client.get("/no/such/path").status_code == 404
        after = scrape(client)

        def moved(name: str, **labels: str) -> float:
            return value(after, name, **labels) - value(before, name, **labels)

        route = {"route": f"{P}/prefill", "method": "POST"}
        assert moved("werk_http_requests_total", status_class="2xx", **route) == 2
        assert moved("werk_http_request_duration_seconds_count", **route) == 2
        assert moved(
            "werk_http_requests_total", route="unmatched", method="GET", status_class="4xx"
        )
        assert moved("werk_prefills_total", model="kv") == 2
        prompt_tokens = first["usage"]["prompt_tokens"] + again["usage"]["prompt_tokens"]
        assert moved("werk_prefill_prompt_tokens_total", model="kv") == prompt_tokens
        assert moved("werk_reused_tokens_total", model="kv") == again["usage"]["cached_tokens"] > 0
        assert moved("werk_handoffs_total", event="issued") == 2
        assert moved("werk_handoffs_total", event="redeemed") == 1
        assert moved("werk_handoffs_total", event="rejected") == 1
        assert value(after, "werk_states", tier="disk", status="ready") >= 1
        assert moved("werk_store_commit_duration_seconds_count") == 1
        assert value(after, "werk_runtime_starts_total", backend="testkv") >= 1
        assert value(after, "werk_memory_host_total_bytes") > 0
        assert (
            sum(
                value(after, "werk_memory_pressure", level=level)
                for level in ("normal", "soft", "hard", "emergency", "unknown")
            )
            == 1
        )
        text = client.get("/metrics").text
    assert first["state"]["id"] not in text and PROMPT not in text
    assert "p_" not in "".join(v for (_, labels), _ in after.items() for _, v in labels)


def test_metrics_public_lets_a_loopback_client_scrape_without_a_key(
    spawn_server: Callable[..., WerkServer],
) -> None:
    server = spawn_server(keys=[KEY], args=["--metrics-public"])
    with server.client() as anonymous:
        samples = scrape(anonymous)
        assert value(samples, "werk_memory_host_total_bytes") > 0
        assert anonymous.get(f"{P}/info").status_code == 401  # only /metrics is public
