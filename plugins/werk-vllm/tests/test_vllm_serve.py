"""A real vLLM (CPU build, managed environment) behind a real ``werk serve``.

One vLLM start for the module (about a minute on two cores): the tiny demo model from
``werk models create-demo --kind vllm``, served with ``WERK_VLLM_ARGS=--enable-prefix-caching``.
Non-streamed and streamed chat through ``/v1``, the rows of a live process, the backend-reported
cached tokens of a repeated long prompt, and no vLLM process left when ``werk serve`` is
SIGKILLed. Fails (never skips) without the environment: ``make test`` installs it first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from werk_vllm.process import user_args

from werk import InvalidRequest, ModelRegistry
from werk.testing import ConformanceReport
from werk.testing.server import WerkServer, werk_serve

WERK = Path(sys.executable).parent / "werk"
BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")
MODEL = "tiny-vllm"
KEY_A, KEY_B = "vllm-key-alpha-0123456789", "vllm-key-bravo-9876543210"
LONG = "lorem ipsum dolor sit amet " * 20  # ~560 tokens with the byte-level tokenizer


def test_reserved_flags_in_werk_vllm_args_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("--port 1", "--model=/x", "--api-key k", "--host 0.0.0.0"):
        monkeypatch.setenv("WERK_VLLM_ARGS", value)
        with pytest.raises(InvalidRequest, match="may not set"):
            user_args()
    monkeypatch.setenv("WERK_VLLM_ARGS", "--enable-prefix-caching --max-model-len 512")
    assert user_args() == ["--enable-prefix-caching", "--max-model-len", "512"]


def _vllm_processes(marker: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def _alive(pids: set[int]) -> list[int]:
    alive = []
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WerkServer]:
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make vllm-env)")
    home = tmp_path_factory.mktemp("vllm-serve") / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=BACKENDS)
    made = subprocess.run(
        [str(WERK), "models", "create-demo", "--kind", "vllm", "--id", MODEL],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    extra = {"WERK_BACKENDS_DIR": BACKENDS, "WERK_VLLM_ARGS": "--enable-prefix-caching"}
    args = ["--model", MODEL, "--api-key", KEY_A, "--api-key", KEY_B]
    with werk_serve(home, None, args, env=extra) as server:
        yield server


def _chat(
    server: WerkServer, content: str, key: str = KEY_A, **extra: object
) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    body.update(extra)
    with server.client(key, timeout=600) as http:
        return http.post("/v1/chat/completions", json=body)


@pytest.mark.slow
def test_chat_through_werk_starts_vllm_and_answers(served: WerkServer) -> None:
    response = _chat(served, "hello")  # the first request starts vLLM (about a minute)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["model"] == MODEL
    assert reply["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.slow
def test_streamed_chat_ends_with_a_finish_reason_and_done(served: WerkServer) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": True,
    }
    with (
        served.client(KEY_A, timeout=600) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    reasons = [
        c.get("finish_reason") for line in lines[:-1] for c in json.loads(line[6:])["choices"]
    ]
    assert any(reasons), lines


@pytest.mark.slow
def test_rows_of_a_live_process(served: WerkServer) -> None:
    assert _chat(served, "hi").status_code == 200  # alive
    with served.client(KEY_A) as http:
        rows = http.get("/werk/v1/capabilities", params={"model": MODEL}).json()["capabilities"]
    by_id = {r["id"]: r for r in rows if r["backend"] == "vllm"}
    assert by_id["runtime.model_residency"]["status"] == "supported"
    prefix = by_id["runtime.state.prefix_cache"]
    assert prefix["status"] == "externally_managed"
    assert prefix["operations"] == ["automatic_reuse"]
    assert by_id["runtime.state.persistence"]["status"] == "unsupported"  # filled by the host


def _cached(usage: dict[str, object]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    assert isinstance(details, dict)
    return int(details.get("cached_tokens") or 0)


@pytest.mark.slow
def test_a_repeated_long_prompt_reports_cached_tokens_only_to_its_own_key(
    served: WerkServer,
) -> None:
    first = _chat(served, LONG, KEY_A, max_tokens=1).json()["usage"]
    again = _chat(served, LONG, KEY_A, max_tokens=1).json()["usage"]
    assert first["prompt_tokens"] == again["prompt_tokens"] > 128
    assert _cached(again) >= 128  # A's repeat reuses A's blocks
    # Key B sends A's prompt: Werk's per-principal cache_salt keeps A's blocks out of reach.
    other = _chat(served, LONG, KEY_B, max_tokens=1).json()["usage"]
    assert _cached(other) == 0
    assert _cached(_chat(served, LONG, KEY_B, max_tokens=1).json()["usage"]) >= 128  # B's own
    # A salt the client sends itself is replaced by Werk's.
    forged = _chat(served, LONG + "!", KEY_B, max_tokens=1, cache_salt="x").json()["usage"]
    assert _cached(forged) >= 128  # shares B's (salted) prefix blocks, not an unsalted cache


@pytest.mark.slow
def test_sigkill_of_werk_serve_leaves_no_vllm_process(served: WerkServer) -> None:
    assert _chat(served, "still there?").status_code == 200
    marker = str(served.home / "models" / "files" / MODEL)
    servers = _vllm_processes(marker)
    assert servers, "no vLLM process serves the model"
    family = set(servers)
    for pid in servers:  # the API server and what it started (the engine core, workers)
        family |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    served.process.send_signal(signal.SIGKILL)
    served.process.wait()
    deadline = time.monotonic() + 30
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(family) == [], "vLLM processes outlived the werk serve that started them"


@pytest.mark.slow
def test_vllm_passes_the_conformance_kit(
    served: WerkServer,
    werk_conformance: Callable[..., ConformanceReport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kit starts its own vLLM (a second start) through the in-process control service."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "kit-home"))
    spec = ModelRegistry(served.home).get(MODEL).spec()
    report = werk_conformance("vllm", spec)
    passed = {c.name for c in report.checks if c.passed}
    assert {"/v1 streamed chat completion", "/v1 stream closed by the client"} <= passed
    assert "/v1 malformed request refused" in passed, report.summary()
