"""Runtimes coming and going under requests: ``werk ps`` and ``GET /werk/v1/runtimes`` while a
model loads (listed with its phase, for how long, how many requests wait; a slow load is a
testkv start held by ``<model file>.hold``), and a runtime that ended before a request reached
it (``werk.RuntimeEnded``: the request goes to a fresh one)."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec
from _server import SpawnServer, WerkServer

from werk.protocol import RuntimeList
from werk.testing.server import WERK, server_env

CHAT = {"model": "kv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _listing(server: WerkServer) -> RuntimeList:
    with server.client() as http:
        return msgspec.json.decode(http.get("/werk/v1/runtimes").content, type=RuntimeList)


def _wait_for(server: WerkServer, predicate: object, what: str) -> RuntimeList:
    deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
    while time.monotonic() < deadline:
        listing = _listing(server)
        if predicate(listing):  # type: ignore[operator]
            return listing
        time.sleep(0.05)
    raise AssertionError(f"never saw {what}: {_listing(server)}")


def _ps(server: WerkServer, home: Path, *args: str) -> str:
    env = server_env(home, extra={"WERK_SERVER": server.base_url, "COLUMNS": "160"})
    done = subprocess.run(
        [str(WERK), "ps", *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_loading_model_is_listed_with_its_phase_and_waiting_requests(
    spawn_server: SpawnServer, tmp_path: Path
) -> None:
    server = spawn_server(args=["--no-preload"])
    model_file = server.home.parent / "kv.testkv"
    assert model_file.is_file()
    hold = model_file.with_name(model_file.name + ".hold")
    hold.touch()
    try:
        with ThreadPoolExecutor(2) as pool:

            def chat(_: int) -> int:
                with server.client(timeout=120) as http:
                    return http.post("/v1/chat/completions", json=CHAT).status_code

            first = pool.submit(chat, 0)
            listing = _wait_for(
                server, lambda r: r.loading and r.loading[0].phase == "starting", "a start"
            )
            [loading] = listing.loading
            assert (loading.model, loading.backend, loading.phase) == ("kv", "testkv", "starting")
            assert loading.waiting == 1 and listing.runtimes == []
            second = pool.submit(chat, 1)
            _wait_for(server, lambda r: r.loading and r.loading[0].waiting == 2, "two waiting")
            table = _ps(server, tmp_path)
            assert "Loading" in table and "starting" in table and "kv" in table
            assert "No model is loaded" not in table
            as_json = msgspec.json.decode(_ps(server, tmp_path, "--json"), type=RuntimeList)
            assert [r.phase for r in as_json.loading] == ["starting"]
            hold.unlink()
            assert first.result(timeout=60) == 200 and second.result(timeout=60) == 200
    finally:
        hold.unlink(missing_ok=True)
    listing = _listing(server)
    assert listing.loading == [] and [r.model for r in listing.runtimes] == ["kv"]
    assert "Loading" not in _ps(server, tmp_path)


def test_a_runtime_that_ended_before_the_request_is_replaced_and_the_request_answered(
    spawn_server: SpawnServer,
) -> None:
    """A backend that raises ``werk.RuntimeEnded`` (nothing was sent) gets the request once
    more on a fresh runtime: the client sees one 200, from a new generation."""
    server = spawn_server()
    model_file = server.home.parent / "kv.testkv"
    with server.client() as http:
        first = http.post("/v1/chat/completions", json=CHAT)
        assert first.status_code == 200, first.text
        model_file.with_name(model_file.name + ".ended").touch()
        again = http.post("/v1/chat/completions", json=CHAT)
        assert again.status_code == 200, again.text
    assert again.json()["system_fingerprint"] != first.json()["system_fingerprint"]
    assert not model_file.with_name(model_file.name + ".ended").exists()
