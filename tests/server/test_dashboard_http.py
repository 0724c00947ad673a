"""The dashboard over real HTTP (a real ``werk serve``, the testkv backend): the page and its
policy, sign-in and the session cookie, the Host and Origin checks, the live stream's isolation
between API keys, and its end when the server stops. The browser itself is driven in
``tests/dashboard/test_dashboard_browser.py``."""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _server import KEY_A, KEY_B, WerkServer, import_model, werk_serve

P = "/werk/v1"
PROMPT = "a dashboard shows what the API shows"


def _origin(server: WerkServer) -> dict[str, str]:
    return {"Origin": server.base_url}


@contextlib.contextmanager
def _sign_in(server: WerkServer, key: str) -> Iterator[httpx.Client]:
    """A client that signed in as the page does (it then carries the session cookie)."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        answer = client.post("/dashboard/session", json={"api_key": key}, headers=_origin(server))
        assert answer.status_code == 200, answer.text
        yield client


def _snapshot(client: httpx.Client) -> dict[str, Any]:
    """The first snapshot of a fresh ``/dashboard/events`` stream."""
    with client.stream("GET", "/dashboard/events", headers={"Accept": "text/event-stream"}) as s:
        assert s.status_code == 200, s.read()
        assert s.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in s.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "snapshot":
                return dict(json.loads(line[6:]))
    raise AssertionError("the stream ended before a snapshot")


def test_the_page_and_its_assets_carry_a_strict_policy(local_server: WerkServer) -> None:
    with local_server.client() as http:
        for path in ("/", "/dashboard"):
            page = http.get(path)
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy
            assert "unsafe" not in policy and "frame-ancestors 'none'" in policy
            assert page.headers["x-frame-options"] == "DENY"
            assert '<script type="module" src="/dashboard/assets/app.js">' in page.text
        for name, kind in (("app.js", "text/javascript"), ("dashboard.css", "text/css")):
            asset = http.get(f"/dashboard/assets/{name}")
            assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
            assert "content-security-policy" in asset.headers
        for bad in (
            "nope.js",
            "index.html",
            "..%2Fsnapshot.py",
            "%2E%2E%2Froutes.py",
            ".hidden.js",
        ):
            assert http.get(f"/dashboard/assets/{bad}").status_code == 404, bad
        assert http.get("/dashboard/session").json() == {
            "auth": "unauthenticated_local",
            "signed_in": True,
        }


def test_local_mode_refuses_a_foreign_host_or_origin(local_server: WerkServer) -> None:
    with local_server.client() as http:
        for path in ("/", "/dashboard", "/dashboard/events", "/dashboard/assets/app.js"):
            foreign = http.get(path, headers={"Host": "evil.example"})
            assert foreign.status_code == 400, path
            assert "loopback" in foreign.json()["error"]["message"]

        def loaded() -> list[str]:
            return [r["model"] for r in http.get(f"{P}/runtimes").json()["runtimes"]]

        assert http.post(f"{P}/models/kv/load", json={}).status_code == 200  # no Origin: a script
        unload = f"{P}/models/kv/unload"
        refused = http.post(unload, json={}, headers={"Origin": "http://evil.example"})
        assert refused.status_code == 400
        assert "Origin" in refused.json()["error"]["message"]
        moved = http.post(unload, json={}, headers={"Origin": "http://127.0.0.1:1"})  # other port
        assert moved.status_code == 400
        assert loaded() == ["kv"]  # nothing was unloaded
        assert http.post(unload, json={}, headers=_origin(local_server)).status_code == 200
        assert loaded() == []
        assert http.post(f"{P}/models/kv/load", json={}).status_code == 200
        snapshot = _snapshot(http)
        assert [r["model"] for r in snapshot["runtimes"]["runtimes"]] == ["kv"]
        assert snapshot["auth"] == "unauthenticated_local"


def test_sign_in_sets_an_httponly_strict_cookie_and_refuses_a_wrong_key(
    auth_server: WerkServer,
) -> None:
    origin = _origin(auth_server)
    with auth_server.client() as http:
        assert http.get("/dashboard/session").json() == {"auth": "api_key", "signed_in": False}
        assert http.get("/").status_code == 200  # the shell holds no data
        assert http.get("/dashboard/events").status_code == 401
        wrong = http.post("/dashboard/session", json={"api_key": "nope"}, headers=origin)
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        no_origin = http.post("/dashboard/session", json={"api_key": KEY_A})
        assert no_origin.status_code == 400 and "set-cookie" not in no_origin.headers
        cross = http.post(
            "/dashboard/session", json={"api_key": KEY_A}, headers={"Origin": "http://evil.example"}
        )
        assert cross.status_code == 400 and "set-cookie" not in cross.headers
        extra = http.post("/dashboard/session", json={"api_key": KEY_A, "x": 1}, headers=origin)
        assert extra.status_code == 400  # unknown fields fail closed
        signed = http.post("/dashboard/session", json={"api_key": KEY_A}, headers=origin)
    assert signed.status_code == 200, signed.text
    cookie = signed.headers["set-cookie"]
    attributes = {part.strip().split("=")[0].lower() for part in cookie.split(";")}
    assert {"httponly", "samesite", "path", "max-age"} <= attributes
    assert "samesite=strict" in cookie.lower()
    assert KEY_A not in cookie and KEY_A not in signed.text
    assert signed.json() == {"auth": "api_key", "signed_in": True}


def test_the_session_cookie_authenticates_same_origin_requests_only(
    auth_server: WerkServer,
) -> None:
    origin = _origin(auth_server)
    with _sign_in(auth_server, KEY_A) as browser:
        assert browser.get("/dashboard/session").json()["signed_in"] is True
        assert browser.get(f"{P}/info").status_code == 200
        assert browser.get("/v1/models").status_code == 200
        load = f"{P}/models/kv/load"
        assert browser.post(load, json={}).status_code == 400  # a cookie write needs an Origin
        foreign = browser.post(load, json={}, headers={"Origin": "http://evil.example"})
        assert foreign.status_code == 400
        assert browser.post(load, json={}, headers=origin).status_code == 200
        value = browser.cookies["werk_session"]
        browser.cookies.set("werk_session", value[:-3] + "AAA", domain="127.0.0.1")
        assert browser.get(f"{P}/info").status_code == 401
        browser.cookies.set("werk_session", value, domain="127.0.0.1")
        out = browser.delete("/dashboard/session", headers=origin)
        assert out.status_code == 204 and "werk_session=" in out.headers["set-cookie"]
        assert "max-age=0" in out.headers["set-cookie"].lower()


def test_each_key_sees_only_its_own_states_and_requests(auth_server: WerkServer) -> None:
    with auth_server.client(KEY_B) as bob:
        made = bob.post(
            f"{P}/prefill",
            json={
                "model": "kv",
                "prompt": PROMPT,
                "allow_experimental": True,
                "policy": {"retention": "disk"},
            },
        )
        assert made.status_code == 200, made.text
        bobs_state = made.json()["state"]["id"]
    with auth_server.client(KEY_A) as alice:
        assert alice.get("/v1/models").status_code == 200
    with _sign_in(auth_server, KEY_A) as browser:
        mine = _snapshot(browser)
    assert mine["states"] == [] and mine["stats"]["models"] == []
    assert [(e["method"], e["path"]) for e in mine["activity"]] == [("GET", "/v1/models")]
    assert bobs_state not in json.dumps(mine)
    with _sign_in(auth_server, KEY_B) as browser:
        his = _snapshot(browser)
    assert [s["id"] for s in his["states"]] == [bobs_state]
    assert any(e["path"] == f"{P}/prefill" for e in his["activity"])
    assert all(e["path"] != "/v1/models" for e in his["activity"])


def test_a_restart_with_another_key_set_revokes_sessions(
    werk_home: Path, testkv_site: Path
) -> None:
    import_model(werk_home, testkv_site, "kv")
    keys = ["--api-key", KEY_A]
    with (
        werk_serve(werk_home, testkv_site, ["--model", "kv", *keys]) as server,
        _sign_in(server, KEY_A) as browser,
    ):
        cookie = browser.cookies["werk_session"]

    def info(server: WerkServer) -> int:
        with server.client() as http:
            http.cookies.set("werk_session", cookie, domain="127.0.0.1")
            return http.get(f"{P}/info").status_code

    with werk_serve(werk_home, testkv_site, ["--model", "kv", *keys]) as server:
        assert info(server) == 200  # the same keys: the session outlives the restart
    with werk_serve(werk_home, testkv_site, ["--model", "kv", *keys, "--api-key", KEY_B]) as server:
        assert info(server) == 401


@pytest.fixture
def patient_server(werk_home: Path, testkv_site: Path) -> Iterator[WerkServer]:
    import_model(werk_home, testkv_site, "kv")
    with werk_serve(werk_home, testkv_site, ["--model", "kv", "--shutdown-grace", "60"]) as s:
        yield s


def test_stopping_the_server_ends_an_open_stream_instead_of_waiting_for_it(
    patient_server: WerkServer,
) -> None:
    with (
        patient_server.client(timeout=90) as http,
        http.stream("GET", "/dashboard/events") as stream,
    ):
        lines = stream.iter_lines()
        for line in lines:
            if line == "event: snapshot":
                break
        # SIGTERM with a 60 s grace for running requests; stop() waits at most 20 s, then
        # kills (-9). werk serve ends by SIGTERM, as it was sent (-15).
        assert patient_server.stop(timeout=20) == -signal.SIGTERM
        rest = list(lines)
    assert any("the server is stopping" in line for line in rest), rest
    assert "cancelled: the server is shutting down" not in patient_server.log()
