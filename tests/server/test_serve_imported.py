"""``werk serve`` without ``--model`` serves every imported model (real server, real CLI).

Each model starts on its first request; one imported while the server runs is served at once,
one removed is not served any more, and ``--model`` still restricts the server to the ones
named.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx
from _server import import_model, werk_serve

from werk.testing.server import WERK, server_env


def _chat(http: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return http.post("/v1/chat/completions", json=body)


def test_every_imported_model_is_served_also_one_imported_later(
    werk_home: Path, testkv_site: Path
) -> None:
    for name in ("a", "b", "c"):
        import_model(werk_home, testkv_site, name, f"{name} words for {name}")
    with werk_serve(werk_home, testkv_site, []) as server, server.client() as http:
        assert "every imported model" in server.log()
        listed = http.get("/v1/models").json()["data"]
        assert sorted(m["id"] for m in listed) == ["a", "b", "c"]
        for name in ("a", "b", "c"):
            answer = _chat(http, name)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == name
        import_model(werk_home, testkv_site, "d", "d words for d")
        assert _chat(http, "d").status_code == 200
        assert "d" in {m["id"] for m in http.get("/v1/models").json()["data"]}
        subprocess.run(
            [str(WERK), "models", "remove", "b", "--execute"],
            check=True,
            capture_output=True,
            env=server_env(werk_home, testkv_site),
        )
        gone = _chat(http, "b")
        assert gone.status_code == 404 and "not imported" in gone.json()["error"]["message"]
        assert sorted(m["id"] for m in http.get("/v1/models").json()["data"]) == ["a", "c", "d"]


def test_model_restricts_the_server_to_the_models_named(werk_home: Path, testkv_site: Path) -> None:
    for name in ("a", "b"):
        import_model(werk_home, testkv_site, name, f"{name} words")
    with (
        werk_serve(werk_home, testkv_site, ["--model", "a"]) as server,
        server.client() as http,
    ):
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["a"]
        assert _chat(http, "b").status_code == 404
