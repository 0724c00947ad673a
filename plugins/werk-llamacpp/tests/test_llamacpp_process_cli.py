"""The real CLI with llama.cpp: ``werk models create-demo``, ``werk run --server``, and a
crashed child inside ``werk serve``."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    gone,
    llama_children,
    needs_llama_server,
    processes_mentioning,
    wait_until,
    werk_env,
    werk_serve,
)

pytestmark = pytest.mark.slow

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def identity(stdout: str) -> str:
    line = stdout.strip().splitlines()[-1]
    assert line.startswith("imported ") and " (llamacpp) identity sha256:" in line, stdout
    return line.rsplit(" ", 1)[1]


def test_create_demo_is_idempotent_per_seed(tmp_path: Path) -> None:
    home = tmp_path / "werk-home"
    first = identity(create_demo(home))
    again = identity(create_demo(home))
    other = identity(create_demo(home, "--id", "other", "--seed", "7"))
    assert first == again and other != first
    gguf = home / "models" / "files" / "demo.gguf"
    assert gguf.is_file() and gguf.stat().st_size > 100_000
    assert stat.S_IMODE((home / "models").stat().st_mode) == 0o700
    listing = subprocess.run(
        [str(WERK), "models", "list", "--json"],
        env=werk_env(home),
        capture_output=True,
        text=True,
        check=True,
    )
    models = {m["id"]: m for m in json.loads(listing.stdout)["models"]}
    assert models["demo"]["backend"] == "llamacpp" and models["demo"]["identity"] == first
    assert models["other"]["identity"] == other
    # The same seed written elsewhere (same file name): same bytes, same identity.
    elsewhere = tmp_path / "elsewhere" / "demo.gguf"
    copy = identity(create_demo(home, "--id", "copy", "--output", str(elsewhere)))
    assert copy == first and elsewhere.read_bytes() == gguf.read_bytes()


def test_create_demo_never_overwrites_a_foreign_file(tmp_path: Path) -> None:
    home = tmp_path / "werk-home"
    foreign = tmp_path / "mine.gguf"
    foreign.write_bytes(b"my own model")
    done = subprocess.run(
        [str(WERK), "models", "create-demo", "--output", str(foreign)],
        env=werk_env(home),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1 and "was not written by create-demo" in done.stderr
    assert foreign.read_bytes() == b"my own model"


@needs_llama_server
def test_a_crashed_child_is_replaced_on_the_next_request(tmp_path: Path) -> None:
    home = tmp_path / "werk-home"
    create_demo(home)
    with werk_serve(home) as served, served.client() as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        (first,) = llama_children(served.process.pid)
        os.kill(first.pid, signal.SIGKILL)
        assert wait_until(lambda: gone(first.pid), timeout=15)

        def holds_the_model() -> bool:
            rows = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()
            (residency,) = [r for r in rows["capabilities"] if r["id"] == "runtime.model_residency"]
            return "holds the model" in residency["reason"]

        # Until Werk has seen the exit, a request may still reach the dying child and get the
        # honest, retryable 503 ("... exited; the next request starts a new one"): a killed
        # process's leader shows as a zombie (gone() above) a moment before the kernel reports
        # the whole thread group's exit to waitid. The residency row says when Werk knows.
        assert wait_until(lambda: not holds_the_model(), timeout=15)
        response = client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200, response.text
        (second,) = llama_children(served.process.pid)
        assert second.pid != first.pid


def test_werk_ps_shows_the_runtime_until_its_keep_alive_expires(tmp_path: Path) -> None:
    """``werk serve --keep-alive 2s``: ``werk ps --json`` lists the llama-server runtime with
    its pid and memory; once idle past 2 s it is unloaded and its process is gone."""
    home = tmp_path / "werk-home"
    create_demo(home)

    def ps(url: str) -> list[dict[str, object]]:
        done = subprocess.run(
            [str(WERK), "ps", "--json", "--server", url],
            env=werk_env(home),
            capture_output=True,
            text=True,
            check=True,
        )
        return list(json.loads(done.stdout)["runtimes"])

    with (
        werk_serve(home, ("--model", "demo", "--keep-alive", "2s", "--no-preload")) as served,
        served.client() as client,
    ):
        assert ps(served.base_url) == []
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        [runtime] = ps(served.base_url)
        (child,) = llama_children(served.process.pid)
        assert runtime["model"] == "demo" and runtime["backend"] == "llamacpp"
        assert runtime["pid"] == child.pid and runtime["busy"] == 0
        assert runtime["keep_alive_seconds"] == 2.0 and runtime["idle_until"] is not None
        assert isinstance(runtime["observed_bytes"], int) and runtime["observed_bytes"] > 0
        assert isinstance(runtime["reserved_bytes"], int) and runtime["reserved_bytes"] > 0
        assert wait_until(lambda: ps(served.base_url) == [], timeout=15)
        assert wait_until(lambda: gone(child.pid), timeout=15)
        # The next request loads it again (a new process); its own keep_alive 0 unloads it at
        # once after the answer.
        body = {**CHAT, "keep_alive": 0}
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert wait_until(lambda: llama_children(served.process.pid) == [], timeout=15)
        assert ps(served.base_url) == []


def test_werk_serve_preloads_its_model_before_the_first_request(tmp_path: Path) -> None:
    """By default ``werk serve --model demo`` starts the llama-server as it starts (as
    ``llama-server -m`` and ``vllm serve`` load at start); the first request uses that child."""
    home = tmp_path / "werk-home"
    create_demo(home)
    with werk_serve(home, ("--model", "demo")) as served, served.client() as client:

        def listed() -> list[dict[str, object]]:
            return list(client.get("/werk/v1/runtimes").json()["runtimes"])

        assert wait_until(lambda: len(listed()) == 1, timeout=30)
        [runtime] = listed()
        (child,) = llama_children(served.process.pid)
        assert runtime["model"] == "demo" and runtime["pid"] == child.pid
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert [p.pid for p in llama_children(served.process.pid)] == [child.pid]
        assert [r["generation"] for r in listed()] == [runtime["generation"]]


def test_a_taken_port_ends_werk_serve_with_one_error_and_no_child_left(
    tmp_path: Path,
) -> None:
    """A taken port ends ``werk serve --model demo`` (which would preload a llama-server) with
    the one clear port error (exit 1, no traceback) and leaves no llama-server behind."""
    import socket

    home = tmp_path / "werk-home"
    create_demo(home)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(WERK), "serve", "--model", "demo", "--port", str(port)],
            env=werk_env(home),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert wait_until(lambda: processes_mentioning(str(home)) == [], timeout=15)


def test_run_server_reuses_the_live_llama_server(tmp_path: Path) -> None:
    """``werk run --server`` goes through the running server's live worker: the process table
    shows the same single llama-server child before and after, and no llama-server is started
    for the client (whose WERK_HOME has no model at all)."""
    home = tmp_path / "werk-home"
    client_home = tmp_path / "client-home"
    client_home.mkdir()
    create_demo(home)
    with werk_serve(home) as served, served.client() as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        (child,) = llama_children(served.process.pid)
        before = {p.pid for p in processes_mentioning("llama-server")}
        for prompt in ("hello there", "and again"):
            run = subprocess.run(
                [
                    str(WERK),
                    "run",
                    "--server",
                    served.base_url,
                    "demo",
                    "--max-tokens",
                    "4",
                    prompt,
                ],
                env=werk_env(client_home),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert run.returncode == 0, run.stderr
            assert run.stdout.strip()
        (still,) = llama_children(served.process.pid)
        assert still.pid == child.pid
        assert {p.pid for p in processes_mentioning("llama-server")} == before
        assert not (client_home / "backends").exists()
