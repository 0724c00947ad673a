"""Backend ``omlx`` behind a real ``werk serve``, against the oMLX stand-in (contract tests: the
stand-in reproduces oMLX's CLI, routes and JSON shapes and does real MLX inference; see
``omlx_standin/standin_omlx.py``).

``--persistence``: the worker runs the native prefix cache under its private directory, a
repeated long system prompt is reported reused from the worker's own cached-token count, the
directory is in ``werk cache`` (refused while the worker runs, removed after), another API key
gets its own worker and no reuse. Without it: ``--no-cache``, nothing reused. A worker killed
mid-stream: a terminal error event, reaped, the next request starts a new worker. Inherited
``OMLX_*`` variables never reach the worker; a CLI whose ``serve --help`` lacks a generated flag
is refused before anything starts.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from omlx_testing import KEY, MODEL, OTHER_KEY, SYSTEM, chat, residency, werk, workers

from werk.testing.server import werk_serve

pytestmark = pytest.mark.slow


def _serve(home: Path, omlx_bin: Path, *flags: str, **env: str) -> Any:
    args = ["--model", MODEL, "--api-key", KEY, "--api-key", OTHER_KEY, *flags]
    return werk_serve(home, None, args, env={"WERK_OMLX_BIN": str(omlx_bin), **env})


def _cached(answer: httpx.Response) -> int:
    assert answer.status_code == 200, answer.text
    usage = answer.json()["usage"]
    assert "cached_tokens" not in usage  # OpenAI's shape only
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def _cache_entries(home: Path) -> dict[str, dict[str, Any]]:
    listed = werk(home, "cache", "list", "--kind", "worker", "--json")
    assert listed.returncode == 0, listed.stderr
    return {e["id"]: e for e in json.loads(listed.stdout)["entries"]}


def test_persistence_reuses_a_long_system_prompt_verified_by_the_worker(
    omlx_home: Path, omlx_bin: Path
) -> None:
    with _serve(omlx_home, omlx_bin, "--persistence", OMLX_API_KEY="inherited") as server:
        before = residency(server)
        assert before["status"] == "unavailable"
        assert "the first request for the model starts one" in before["reason"]
        first = chat(server, "Hello there.")
        assert first.json()["model"] == MODEL
        assert _cached(first) == 0
        assert _cached(chat(server, "And again.")) > 100  # the system prompt's tokens
        (worker,) = workers(omlx_home)
        cmdline = worker.cmdline()
        base = Path(cmdline[cmdline.index("--base-path") + 1])
        assert base.parent == omlx_home / "backends" / "omlx" / "workers"
        cache_dir = base / "cache" / "prefix-cache"
        assert cmdline[cmdline.index("--paged-ssd-cache-dir") + 1] == str(cache_dir)
        assert cmdline[cmdline.index("--paged-ssd-cache-max-size") + 1] == "4GB"
        assert cmdline[cmdline.index("--host") + 1] == "127.0.0.1"
        assert [p.name for p in (base / "models").iterdir()] == [MODEL]  # only this model
        assert any(cache_dir.rglob("*.safetensors"))  # the worker's real cache files
        assert not any(name.startswith("OMLX_") for name in worker.environ())
        with server.client(KEY) as http:
            answer = http.get("/werk/v1/capabilities", params={"model": MODEL}).json()
        rows = {r["id"]: r for r in answer["capabilities"] if r["id"].startswith("runtime.")}
        unsupported = {
            "runtime.state.prefix_cache", "runtime.state.persistence", "runtime.state.restore",
            "runtime.state.tier.disk", "runtime.state.tier.ram", "runtime.state.tier.vram",
            "runtime.pd.prefill", "runtime.pd.decode", "runtime.pd.handoff",
            "runtime.experts.residency",
        }  # fmt: skip
        assert {i for i, r in rows.items() if r["status"] == "unsupported"} >= unsupported
        assert "runtime.state.restore.cross_restart" not in rows
        assert rows["runtime.experts.residency"]["reason"] == (
            "no expert adapter: WERK_OMLX_EXPERT_CACHE_MB is not set to a positive number of MiB"
        )
        row = residency(server)
        assert row["status"] == "supported"
        guardian = worker.ppid()  # the worker runs under its process-group guardian
        assert f"pid {guardian} for {MODEL} (prefix cache on" in row["reason"]
        assert "1 of 2 request(s) reused a cached prefix" in row["reason"]
        entry = _cache_entries(omlx_home)[f"worker:werk-omlx/{base.name}"]
        assert entry["active"] is True and entry["model"] == MODEL and entry["bytes"] > 0
        refused = werk(omlx_home, "cache", "purge", f"worker:werk-omlx/{base.name}", "--execute")
        assert refused.returncode == 1 and base.is_dir()
    entry = _cache_entries(omlx_home)[f"worker:werk-omlx/{base.name}"]
    assert entry["active"] is False
    purged = werk(omlx_home, "cache", "purge", f"worker:werk-omlx/{base.name}", "--execute")
    assert purged.returncode == 0, purged.stderr
    assert not base.exists()


def test_each_api_key_gets_its_own_worker_and_never_another_keys_prefix(
    omlx_home: Path, omlx_bin: Path
) -> None:
    with _serve(omlx_home, omlx_bin, "--persistence") as server:
        assert _cached(chat(server, "Mine.")) == 0
        assert _cached(chat(server, "Mine.", key=OTHER_KEY)) == 0  # the same prompt, cold
        assert _cached(chat(server, "Mine.")) > 100
        assert len(workers(omlx_home)) == 2


def test_a_streamed_answer_reports_verified_reuse_in_openais_shape(
    omlx_home: Path, omlx_bin: Path
) -> None:
    with _serve(omlx_home, omlx_bin, "--persistence") as server:
        assert _cached(chat(server, "Warm up.")) == 0
        body = {
            "model": MODEL,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with server.client(KEY, timeout=120) as http:
            response = http.post("/v1/chat/completions", json=body)
        events = [
            line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data:")
        ]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert {c["model"] for c in chunks} == {MODEL}
        (usage,) = [c["usage"] for c in chunks if c.get("usage")]
        assert "cached_tokens" not in usage
        assert usage["prompt_tokens_details"]["cached_tokens"] > 100


def test_without_persistence_the_worker_runs_without_a_cache(
    omlx_home: Path, omlx_bin: Path
) -> None:
    with _serve(omlx_home, omlx_bin) as server:
        assert _cached(chat(server, "One.")) == 0
        assert _cached(chat(server, "One.")) == 0
        assert _cached(chat(server, "One.", key=OTHER_KEY)) == 0
        with server.client(KEY, timeout=120) as http:
            text = http.post(
                "/v1/completions",
                json={"model": MODEL, "prompt": "Once", "max_tokens": 3, "temperature": 0},
            )
        assert text.status_code == 200, text.text
        assert text.json()["object"] == "text_completion" and text.json()["model"] == MODEL
        assert text.json()["usage"]["completion_tokens"] == 3
        (worker,) = workers(omlx_home)  # one worker for every key: it keeps no prefix
        assert "--no-cache" in worker.cmdline()
        assert "--paged-ssd-cache-dir" not in worker.cmdline()
        assert "prefix cache off" in residency(server)["reason"]


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_is_replaced(
    omlx_home: Path, omlx_bin: Path
) -> None:
    with _serve(omlx_home, omlx_bin) as server:
        assert chat(server, "Start.").status_code == 200
        (worker,) = workers(omlx_home)
        lines: list[str] = []
        body = {"model": MODEL, "prompt": "Count:", "max_tokens": 4000, "temperature": 0,
                "stream": True}  # fmt: skip

        def stream() -> None:
            with (
                server.client(KEY, timeout=120) as http,
                http.stream("POST", "/v1/completions", json=body) as response,
            ):
                lines.extend(response.iter_lines())

        reader = threading.Thread(target=stream)
        reader.start()
        deadline = time.monotonic() + 60
        while sum(1 for line in lines if line.startswith("data: {")) < 3:
            assert time.monotonic() < deadline, lines
            time.sleep(0.01)
        worker.send_signal(signal.SIGKILL)
        reader.join(timeout=60)
        events = [line[len("data: ") :] for line in lines if line.startswith("data:")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["error"]["code"] == "backend_error", last
        assert not any(
            c.get("choices") and c["choices"][0].get("finish_reason")
            for c in map(json.loads, events[:-2])
        )
        deadline = time.monotonic() + 10
        while psutil.pid_exists(worker.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(worker.pid)  # reaped, not a zombie
        row = residency(server)
        assert row["status"] == "unavailable" and "exited" in row["reason"]
        assert chat(server, "Again.").status_code == 200
        (fresh,) = workers(omlx_home)
        assert fresh.pid != worker.pid


def test_an_omlx_without_a_generated_flag_is_refused_before_anything_starts(
    omlx_home: Path, tmp_path: Path
) -> None:
    fake = tmp_path / "old-omlx"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = serve ] && [ "$2" = --help ]; then\n'
        "  echo 'usage: omlx serve [--model-dir D] [--host H] [--port P] [--api-key K]'\n"
        "  echo '  [--base-path B] [--no-cache]'; exit 0; fi\n"
        'if [ "$1" = serve ]; then touch "$0.started"; fi\n'
        "exit 2\n"
    )
    fake.chmod(0o755)
    with _serve(omlx_home, fake, "--persistence") as server:
        answer = chat(server, "Hello.")
        assert answer.status_code == 503, answer.text
        assert "does not offer --paged-ssd-cache-dir" in answer.json()["error"]["message"]
    assert not Path(f"{fake}.started").exists()


def test_sigkill_of_werk_serve_leaves_no_omlx_worker(omlx_home: Path, omlx_bin: Path) -> None:
    with _serve(omlx_home, omlx_bin, "--persistence") as server:
        assert chat(server, "One.").status_code == 200
        assert chat(server, "Two.", key=OTHER_KEY).status_code == 200
        pids = [w.pid for w in workers(omlx_home)]
        assert len(pids) == 2
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not workers(omlx_home)
