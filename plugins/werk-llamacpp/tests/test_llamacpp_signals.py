"""No orphaned llama-server after ``werk serve`` is interrupted (seed: the CLI signal paragraph).

A real ``werk serve --model demo`` (demo created with ``werk models create-demo`` in a private
WERK_HOME) is stopped with SIGINT while the first ``/v1`` request is still loading the model, or
with SIGTERM/SIGHUP/SIGINT after it has loaded. Afterwards the process table must hold no
llama-server of that WERK_HOME, and the generation directory must be gone (Werk cleaned up
itself rather than relying only on PDEATHSIG).

"Loading" is made long and deterministic with a stand-in executable that answers
``--help``/``--version`` at once and, as a server, waits before it *becomes* (``exec``) the real
llama-server: the same process Werk spawned, still not ready.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest
from test_llamacpp_process_support import (
    create_demo,
    delayed_wrapper,
    gone,
    llama_children,
    needs_llama_server,
    processes_mentioning,
    python_wrapper,
    wait_until,
    werk_serve,
)

pytestmark = [pytest.mark.slow, needs_llama_server]

CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def generation_dirs(home: Path) -> list[str]:
    root = home / "backends" / "llamacpp"
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


def post_in_background(base_url: str) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(httpx.post(f"{base_url}/v1/chat/completions", json=CHAT, timeout=120))
        except httpx.HTTPError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "werk-home"
    root.mkdir()
    create_demo(root)
    return root


@pytest.mark.parametrize("load_seconds", [120.0, 0.0], ids=["stalled-load", "real-load"])
def test_ctrl_c_during_model_load(home: Path, tmp_path: Path, load_seconds: float) -> None:
    env = {}
    if load_seconds:
        env["WERK_LLAMA_SERVER"] = str(delayed_wrapper(tmp_path / "bin" / "llama-server", 120))
    with werk_serve(home, env=env) as served:
        thread, outcome = post_in_background(served.base_url)
        assert wait_until(lambda: bool(llama_children(served.process.pid)), timeout=30)
        children = [c.pid for c in llama_children(served.process.pid)]
        served.process.send_signal(signal.SIGINT)  # Ctrl+C while the model is loading
        served.process.wait(timeout=60)
        assert wait_until(lambda: all(gone(pid) for pid in children), timeout=15)
        assert processes_mentioning(str(home)) == []
        assert generation_dirs(home) == []
        thread.join(timeout=30)
        assert not thread.is_alive() and outcome
        if load_seconds:  # the request never got an answer from a model
            assert not isinstance(outcome[0], httpx.Response) or outcome[0].status_code != 200


def test_ctrl_c_while_an_inspection_command_hangs_kills_it(home: Path, tmp_path: Path) -> None:
    """An executable whose ``--list-devices`` never answers: Ctrl+C while Werk inspects it
    leaves no process behind (the inspection commands are killed, not abandoned)."""
    hanging = python_wrapper(
        tmp_path / "bin" / "llama-server", "time.sleep(120)\n", direct=("--help", "--version")
    )
    with werk_serve(home, env={"WERK_LLAMA_SERVER": str(hanging)}) as served:
        post_in_background(served.base_url)

        def inspecting() -> bool:
            return any("--list-devices" in c.cmdline() for c in llama_children(served.process.pid))

        assert wait_until(inspecting, timeout=30)
        children = [c.pid for c in llama_children(served.process.pid)]
        served.process.send_signal(signal.SIGINT)
        served.process.wait(timeout=60)
        assert wait_until(lambda: all(gone(pid) for pid in children), timeout=15)
        assert processes_mentioning(str(tmp_path / "bin")) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_stop_signal_after_load_reaps_the_child(home: Path, sig: signal.Signals) -> None:
    with werk_serve(home) as served:
        with served.client() as client:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        children = [c.pid for c in llama_children(served.process.pid)]
        assert len(children) == 1 and generation_dirs(home) != []
        served.process.send_signal(sig)
        served.process.wait(timeout=60)
        assert wait_until(lambda: gone(children[0]), timeout=15)
        assert processes_mentioning(str(home)) == []
        assert generation_dirs(home) == []  # stopped by Werk: its directory was removed
