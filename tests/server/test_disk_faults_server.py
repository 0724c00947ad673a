"""A full and a read-only ``WERK_HOME`` under a running ``werk serve`` (real kernel errors on a
small ``tmpfs``; skipped with the reason where this machine cannot mount one).

A disk prefill whose state cannot be written answers a typed error: ``507`` with code
``unavailable``, ``retryable: true`` and ``Retry-After`` when the disk is full, ``503``
``retryable: false`` when it is read-only. Meanwhile listings, inspection and ``/v1`` keep
answering; once the disk is writable again the same request succeeds and every state committed
before is intact.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _server import WerkServer, import_model, werk_serve

from werk.testing.disk import FilesystemUnavailable, fill, read_only, small_filesystem

DISK = {"retention": "disk", "reuse": "disabled"}


@pytest.fixture
def served(tmp_path: Path, testkv_site: Path) -> Iterator[tuple[WerkServer, Path]]:
    try:
        # WERK_HOME is the mount itself: the model file and the server's log (both written
        # next to the home) stay off it, so it can be remounted read-only under the server.
        with small_filesystem(tmp_path / "home", 16 * 1024 * 1024) as home:
            disk = home
            import_model(home, testkv_site, "kv", "alpha beta gamma delta")
            with werk_serve(home, testkv_site, ["--model", "kv"]) as server:
                yield server, disk
    except FilesystemUnavailable as exc:
        pytest.skip(f"no small file system can be mounted here: {exc}")


def _prefill(http: httpx.Client, prompt: str, **extra: Any) -> httpx.Response:
    body = {"model": "kv", "prompt": prompt, "allow_experimental": True, "policy": DISK, **extra}
    return http.post("/werk/v1/prefill", json=body)


def _state_of(http: httpx.Client, prompt: str) -> str:
    """Prefill ``prompt`` into a disk state (it must succeed); its id."""
    answer = _prefill(http, prompt)
    assert answer.status_code == 200, answer.text
    state_id: str = answer.json()["state"]["id"]
    return state_id


def _serves_reads(http: httpx.Client, state_id: str) -> None:
    listed = http.get("/werk/v1/states")
    assert listed.status_code == 200, listed.text
    assert [s["id"] for s in listed.json()["states"]] == [state_id]
    assert http.get(f"/werk/v1/states/{state_id}").status_code == 200
    chat = {"model": "kv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert http.post("/v1/chat/completions", json=chat).status_code == 200


def test_a_full_disk_is_a_retryable_507_and_nothing_is_lost(
    served: tuple[WerkServer, Path],
) -> None:
    server, disk = served
    with server.client() as http:
        state_id = _state_of(http, "the first state")
        filler = fill(disk)
        refused = _prefill(http, "a second state")
        assert refused.status_code == 507, refused.text
        error = refused.json()["error"]
        assert error["code"] == "unavailable" and error["retryable"] is True
        assert "no space left" in error["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        _serves_reads(http, state_id)
        filler.unlink()
        second_id = _state_of(http, "a second state")
        listed = http.get("/werk/v1/states").json()["states"]
        assert [s["id"] for s in listed] == [state_id, second_id]
        reused = _prefill(
            http, "the first state", policy={"retention": "disk", "reuse": "required"}
        )
        assert reused.status_code == 200, reused.text
        reuse = reused.json()["reuse"]
        assert (reuse["outcome"], reuse["state_id"], reuse["match"]) == (
            "reused",
            state_id,
            "exact",
        )


def test_a_read_only_disk_is_a_final_503_and_reads_go_on(
    served: tuple[WerkServer, Path],
) -> None:
    server, disk = served
    with server.client() as http:
        state_id = _state_of(http, "the first state")
        with read_only(disk):
            refused = _prefill(http, "a second state")
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "unavailable" and error["retryable"] is False
            assert "read-only" in error["message"]
            _serves_reads(http, state_id)
        _state_of(http, "a second state")
