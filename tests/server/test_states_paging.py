"""``GET /werk/v1/states`` in pages through a real ``werk serve``: ``limit`` and ``cursor``.

States are listed by id, which is creation order; the store reads a page at a time. Pages of
any size concatenate to the full listing, filters apply inside pages, and a bad ``limit`` or
``cursor`` is ``invalid_request``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from _server import WerkServer


def _prefill(http: httpx.Client, prompt: str, retention: str) -> str:
    body = {"model": "kv", "prompt": prompt, "allow_experimental": True,
            "policy": {"retention": retention, "reuse": "disabled"}}  # fmt: skip
    answer = http.post("/werk/v1/prefill", json=body)
    assert answer.status_code == 200, answer.text
    state_id: str = answer.json()["state"]["id"]
    return state_id


def _pages(http: httpx.Client, limit: int, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        query = {"limit": limit, **params, **({"cursor": cursor} if cursor else {})}
        answer = http.get("/werk/v1/states", params=query)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        pages.append([s["id"] for s in body["states"]])
        cursor = body.get("next_cursor")
        if cursor is None:
            return pages


def test_pages_of_states_concatenate_to_the_listing(local_server: WerkServer) -> None:
    with local_server.client() as http:
        made = [_prefill(http, f"prompt {i}", "disk") for i in range(7)]
        pinned = {made[1], made[4], made[5]}
        for state_id in pinned:
            body = {"pinned": True, "dry_run": False}
            answer = http.post(f"/werk/v1/states/{state_id}/pin", json=body)
            assert answer.status_code == 200, answer.text
        full = http.get("/werk/v1/states").json()
        assert [s["id"] for s in full["states"]] == made  # creation order
        assert full["next_cursor"] is None
        for limit in (1, 2, 3, 7, 1000):
            pages = _pages(http, limit)
            assert [i for page in pages for i in page] == made
            assert all(len(page) <= limit for page in pages)
        kept = _pages(http, 2, pinned="true")
        assert [i for page in kept for i in page] == [i for i in made if i in pinned]


@pytest.mark.parametrize(
    "params", [{"limit": "0"}, {"limit": "1001"}, {"limit": "two"}, {"cursor": "not-ours"}]
)
def test_a_bad_limit_or_cursor_is_invalid_request(
    local_server: WerkServer, params: dict[str, str]
) -> None:
    with local_server.client() as http:
        answer = http.get("/werk/v1/states", params=params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
