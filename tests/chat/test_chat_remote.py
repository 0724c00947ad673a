"""``werk run --server`` / ``werk chat --server`` through a real ``werk serve`` subprocess.

The server's live runtime answers every invocation: the testkv runtime generation (in the
capability reasons and in each reply's ``system_fingerprint``) stays the same across CLI
processes, and the client's WERK_HOME has no model at all, so nothing could have started
locally. The conversation archive lives on the client and can be resumed by a different
runtime of the same model (here: a local one), giving the same answers as an uninterrupted
conversation.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from _chat_support import PLUGINS, import_model, ok, werk
from _server import werk_serve

TURNS = ("hello there", "tell me more", "and then?")
MODEL_TEXT = "alpha beta gamma delta epsilon zeta eta\n"
KEY = "chat-remote-key-0123456789"


def prefix_cache_reason(base_url: str) -> str:
    response = httpx.get(f"{base_url}/werk/v1/capabilities", params={"model": "kv"}, timeout=30)
    assert response.status_code == 200, response.text
    rows = [r for r in response.json()["capabilities"] if r["id"] == "runtime.state.prefix_cache"]
    assert len(rows) == 1, rows
    return str(rows[0]["reason"])


def messages(home: Path, name: str) -> list[tuple[str, str]]:
    record = json.loads((home / "chat-sessions" / name / "messages.json").read_text())
    return [(m["role"], m["content"]) for m in record["messages"]]


def test_run_server_reuses_the_live_runtime(home: Path, plugin_site: Path, tmp_path: Path) -> None:
    server_home = tmp_path / "server-home"
    server_home.mkdir()
    import_model(server_home, plugin_site, "kv", "testkv", MODEL_TEXT)
    with werk_serve(
        server_home,
        plugin_site,
        ["--model", "kv", "--no-preload"],  # the first `werk run` starts the runtime
        env={"WERK_LOAD_PLUGINS": PLUGINS},
    ) as server:
        url = server.base_url
        assert "no live testkv runtime" in prefix_cache_reason(url)
        first = ok(
            werk(
                home,
                plugin_site,
                "run",
                "--server",
                url,
                "kv",
                "--session",
                "r1",
                "--json",
                TURNS[0],
            )
        )
        generation = json.loads(first.stdout)["system_fingerprint"]
        assert generation.startswith("g_")
        assert f"generation {generation} is live" in prefix_cache_reason(url)
        second = ok(
            werk(
                home,
                plugin_site,
                "run",
                "--server",
                url,
                "kv",
                "--session",
                "r1",
                "-v",
                "--json",
                TURNS[1],
            )
        )
        assert json.loads(second.stdout)["system_fingerprint"] == generation
        assert f"generation {generation} is live" in prefix_cache_reason(url)
        assert "no local worker is started" in second.stderr
        assert "request: 3 message(s)" in second.stderr  # the archived history went along
    assert not (home / "models").exists()  # the client could not have started anything
    assert not (server_home / "chat-sessions").exists()  # the archive stays on the client
    remote = messages(home, "r1")
    assert [m[1] for m in remote[0::2]] == list(TURNS[:2])

    # A different runtime of the same model (local, this time) resumes the same archive.
    import_model(home, plugin_site, "kv", "testkv", MODEL_TEXT)
    ok(werk(home, plugin_site, "run", "kv", "--session", "r1", TURNS[2]))
    ok(werk(home, plugin_site, "chat", "kv", "--session", "ref", stdin="\n".join(TURNS) + "\n"))
    assert messages(home, "r1") == messages(home, "ref")


def test_server_keys_urls_and_errors(home: Path, plugin_site: Path, tmp_path: Path) -> None:
    server_home = tmp_path / "server-home"
    server_home.mkdir()
    import_model(server_home, plugin_site, "kv", "testkv", MODEL_TEXT)
    key_file = tmp_path / "key.txt"
    key_file.write_text(f"# the key\n{KEY}\n")
    with werk_serve(
        server_home,
        plugin_site,
        ["--model", "kv", "--api-key", KEY],
        env={"WERK_LOAD_PLUGINS": PLUGINS},
    ) as server:
        url = server.base_url
        denied = werk(home, plugin_site, "run", "--server", url, "kv", "hi")
        assert denied.returncode == 1 and "(unauthenticated)" in denied.stderr
        by_env = ok(werk(home, plugin_site, "run", "--server", url, "kv", "hi", WERK_API_KEY=KEY))
        by_file = ok(
            werk(
                home,
                plugin_site,
                "run",
                "--server",
                url,
                "--api-key-file",
                str(key_file),
                "kv",
                "hi",
            )
        )
        assert by_env.stdout == by_file.stdout and by_env.stdout.strip()
        unknown = werk(
            home, plugin_site, "run", "--server", url, "nope", "hi", "--json", WERK_API_KEY=KEY
        )
        assert unknown.returncode == 1
        assert json.loads(unknown.stdout)["error"]["code"] == "not_found"
        failing = werk(
            home,
            plugin_site,
            "chat",
            "--server",
            url,
            "kv",
            "--session",
            "f",
            stdin="x <<fail-decode>>\nfine\n",
            WERK_API_KEY=KEY,
        )
        assert failing.returncode == 0, failing.stderr  # a failed turn does not end the chat
        assert "(backend_error); the turn was not kept" in failing.stderr
        assert [m[1] for m in messages(home, "f")[0::2]] == ["fine"]
        port = url.rsplit(":", 1)[1]
    bad_url = werk(home, plugin_site, "run", "--server", "https://127.0.0.1:1", "kv", "hi")
    assert bad_url.returncode == 2
    gone = werk(home, plugin_site, "run", "--server", f"http://127.0.0.1:{port}", "kv", "hi")
    assert gone.returncode == 1 and "is it running?" in gone.stderr
