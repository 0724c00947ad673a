"""``werk cache list`` / ``werk cache purge`` on a populated WERK_HOME, end to end.

The home holds all three categories, each created the way users create them:

* chat sessions ``a`` and ``b`` (``werk run --session``), native KV data beside ``b`` (what the
  llama.cpp snapshot provider will write into ``native/``), and ``c`` held by a live
  ``werk chat`` process (its ``flock`` makes it active);
* worker caches of the ``werk-standin`` test plugin, reported through its
  ``werk_cache_inventory`` hook: ``w1`` plain, ``w2`` pinned and two days old, ``w3`` locked by
  this test process (active);
* managed disk states committed by a real ``werk serve`` prefill with retention ``disk``, one of
  them pinned.

Purging previews by default and changes nothing; ``--execute`` removes exactly what the preview
listed, and a digest of every other file, link and directory under WERK_HOME is unchanged.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from _chat_support import (
    HANG_GUARD,
    PLUGINS,
    WERK,
    cli_env,
    import_model,
    ok,
    tree_digest,
    werk,
)
from _server import werk_serve

from werk.chat.archive import SessionStore

PLUGIN = "werk-standin"


def cache(home: Path, site: Path, *args: str) -> Any:
    return json.loads(ok(werk(home, site, "cache", *args, "--json")).stdout)


def ids(entries: list[dict[str, Any]]) -> set[str]:
    return {e["id"] for e in entries}


def make_worker(home: Path, name: str, model: str, *, pinned: bool = False) -> Path:
    path = home / "backends" / "standin" / "workers" / name
    path.mkdir(parents=True)
    (path / "model").write_text(model)
    (path / "cache.bin").write_bytes(os.urandom(2048))
    if pinned:
        (path / "pinned").touch()
    return path


def prefill_disk_state(base_url: str, prompt: str, *, pin: bool) -> str:
    response = httpx.post(
        f"{base_url}/werk/v1/prefill",
        json={
            "model": "kv",
            "prompt": prompt,
            "policy": {"retention": "disk", "pin": pin},
            "allow_experimental": True,
        },
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return str(response.json()["state"]["id"])


def wait_until_held(home: Path, name: str, proc: subprocess.Popen[bytes]) -> None:
    guard = time.monotonic() + HANG_GUARD
    while SessionStore(home).holder(name) is None:
        assert proc.poll() is None, "werk chat exited early"
        if time.monotonic() > guard:
            pytest.fail(f"session {name} was never locked")
        time.sleep(0.05)


def test_inventory_and_purge(home: Path, plugin_site: Path) -> None:
    site = plugin_site
    import_model(home, site, "kv", "testkv", "alpha beta gamma delta\n")
    ok(werk(home, site, "run", "kv", "--session", "a", "hello"))
    ok(werk(home, site, "run", "kv", "--session", "b", "hi there"))
    native = home / "chat-sessions" / "b" / "native"
    native.mkdir(mode=0o700)
    (native / "slot-0.bin").write_bytes(os.urandom(4096))
    make_worker(home, "w1", "kv")
    w2 = make_worker(home, "w2", "other", pinned=True)
    two_days_ago = time.time() - 2 * 86400
    os.utime(w2, (two_days_ago, two_days_ago))
    w3 = make_worker(home, "w3", "kv")
    with werk_serve(home, site, ["--model", "kv"], env={"WERK_LOAD_PLUGINS": PLUGINS}) as server:
        loose = prefill_disk_state(server.base_url, "a loose state", pin=False)
        pinned = prefill_disk_state(server.base_url, "a pinned state", pin=True)
    live_chat = subprocess.Popen(
        [str(WERK), "chat", "kv", "--session", "c"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=cli_env(home, site),
    )
    w3_lock = os.open(w3 / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(w3_lock, fcntl.LOCK_EX)
    try:
        wait_until_held(home, "c", live_chat)
        check_list_and_purge(home, site, loose, pinned, w3)
    finally:
        os.close(w3_lock)
        assert live_chat.stdin is not None
        live_chat.stdin.close()
        live_chat.wait(timeout=HANG_GUARD)
    assert live_chat.returncode == 0

    # Nothing is active any more: include the conversations; pinned entries still stay.
    final = cache(home, site, "purge", "--all", "--include-conversations", "--execute")
    assert set(final["removed"]) == {"chat:a", "chat:b", "chat:c", f"worker:{PLUGIN}/w3"}
    assert {(s["id"], s["reason"]) for s in final["skipped"]} == {
        (f"worker:{PLUGIN}/w2", "pinned"),
        (f"state:p_local/{pinned}", "pinned"),
    }
    assert ids(cache(home, site, "list")["entries"]) == {
        f"worker:{PLUGIN}/w2",
        f"state:p_local/{pinned}",
    }
    assert (home / "models" / "kv.json").is_file()  # model manifests (and weights) untouched
    assert (home.parent / "kv.testkv").is_file()


def check_list_and_purge(home: Path, site: Path, loose: str, pinned: str, w3: Path) -> None:
    entries = {e["id"]: e for e in cache(home, site, "list")["entries"]}
    assert set(entries) == {
        "chat:a",
        "chat:b",
        "chat:b/native",
        "chat:c",
        f"worker:{PLUGIN}/w1",
        f"worker:{PLUGIN}/w2",
        f"worker:{PLUGIN}/w3",
        f"state:p_local/{loose}",
        f"state:p_local/{pinned}",
    }
    assert {e["kind"] for e in entries.values()} == {"chat", "worker", "state"}
    assert entries["chat:c"]["active"] and entries["chat:c"]["holder"].startswith("pid ")
    assert entries[f"worker:{PLUGIN}/w3"]["active"]
    assert entries[f"worker:{PLUGIN}/w2"]["pinned"] and entries[f"state:p_local/{pinned}"]["pinned"]
    assert [i for i, e in entries.items() if e["conversation"]] == ["chat:a", "chat:b", "chat:c"]
    assert entries["chat:b/native"]["bytes"] == 4096
    assert entries["chat:b"]["location"] == "chat-sessions/b"
    assert entries[f"state:p_local/{loose}"]["location"] == f"runtime-state/v1/p_local/{loose}"

    # Pages of 4, by id: together exactly the full listing, each entry once.
    paged: list[str] = []
    page = cache(home, site, "list", "--limit", "4")
    while True:
        assert len(page["entries"]) <= 4
        paged += [e["id"] for e in page["entries"]]
        if page["next_cursor"] is None:
            break
        page = cache(home, site, "list", "--limit", "4", "--cursor", page["next_cursor"])
    assert paged == sorted(entries)
    bad = werk(home, site, "cache", "list", "--cursor", "nonsense", "--json")
    assert bad.returncode != 0 and "cursor" in bad.stdout + bad.stderr

    worker_kv = cache(home, site, "list", "--kind", "worker", "--model", "kv")["entries"]
    assert ids(worker_kv) == {f"worker:{PLUGIN}/w1", f"worker:{PLUGIN}/w3"}
    assert ids(cache(home, site, "list", "--older-than", "1d")["entries"]) == {
        f"worker:{PLUGIN}/w2"
    }

    before = tree_digest(home)
    preview = cache(home, site, "purge", "--all")
    assert preview["executed"] is False and preview["removed"] == []
    planned = ids(preview["remove"])
    assert planned == {"chat:b/native", f"worker:{PLUGIN}/w1", f"state:p_local/{loose}"}
    assert {(s["id"], s["reason"]) for s in preview["skipped"]} == {
        ("chat:a", "conversation"),
        ("chat:b", "conversation"),
        ("chat:c", "active"),
        (f"worker:{PLUGIN}/w2", "pinned"),
        (f"worker:{PLUGIN}/w3", "active"),
        (f"state:p_local/{pinned}", "pinned"),
    }
    assert tree_digest(home) == before  # a preview changes nothing

    targets = [home / e["location"] for e in preview["remove"]]
    rest_before = tree_digest(home, exclude=targets)
    done = cache(home, site, "purge", "--all", "--execute")
    assert done["executed"] is True and done["failed"] == []
    assert set(done["removed"]) == planned
    assert not any(path.exists() for path in targets)
    assert tree_digest(home, exclude=targets) == rest_before  # nothing else changed

    for named in ("chat:c", f"worker:{PLUGIN}/w3"):  # active: refused even when named
        refused = werk(home, site, "cache", "purge", named, "--execute", "--json")
        assert refused.returncode == 1
        assert json.loads(refused.stdout)["skipped"][0]["reason"] == "active"
    assert (home / "chat-sessions" / "c" / "messages.json").is_file() and w3.is_dir()


def test_usage_errors_exit_2(home: Path, plugin_site: Path) -> None:
    for args in (
        ("cache", "purge"),
        ("cache", "purge", "chat:x", "--all"),
        ("cache", "purge", "chat:x", "--kind", "chat"),
        ("cache", "list", "--kind", "weights"),
        ("cache", "list", "--older-than", "soon"),
    ):
        assert werk(home, plugin_site, *args).returncode == 2, args
    missing = werk(home, plugin_site, "cache", "purge", "chat:nope")
    assert missing.returncode == 1 and "no cache entry" in missing.stderr
    empty = ok(werk(home, plugin_site, "cache", "list"))
    assert empty.stdout.strip() == "No cache entries."
    assert not any(home.iterdir())  # listing created nothing
