"""ONNX Runtime GenAI for real behind a real ``werk serve``: backend ``onnx-genai`` (a companion
worker with a model LRU) and backend ``onnx-runner`` (a runner per request: the bundled
reference runner, and a custom runner given as the model's ``runner`` option — a small
standard-library program speaking the runner contract, standing in for any external runner
such as a Candle or Burn binary).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from onnx_testing import (
    GENAI,
    GENAI_B,
    KEY,
    RUNNER,
    chat,
    events,
    require_backends,
    residency,
    werk,
)

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

CUSTOM, SLOW = "custom-runner", "slow-runner"
CUSTOM_RUNNER = textwrap.dedent(
    """
    import json, sys, time
    request = json.loads(sys.stdin.readline())
    text = request["messages"][-1]["content"] if "messages" in request else request["prompt"]
    print(f"custom runner got {text!r}", file=sys.stderr, flush=True)
    if text == "sleep":
        time.sleep(60)
    if text == "fail":
        print("Traceback: the runner broke", file=sys.stderr, flush=True)
        print(json.dumps({"error": "broken on purpose"}), flush=True)
        sys.exit(3)
    folder = request["model"].rsplit("/", 1)[-1]
    for word in [folder, str(request["max_tokens"]), text]:
        print(json.dumps({"delta": word + " "}), flush=True)
    print(json.dumps({"done": True, "finish_reason": "stop",
                      "usage": {"prompt_tokens": 1, "completion_tokens": 3}}), flush=True)
    """
)


@pytest.fixture(scope="module")
def custom_home(onnx_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny ONNX folder imported twice more for onnx-runner with a custom runner: one
    plain, one with a 1-second runner_timeout."""
    script = tmp_path_factory.mktemp("runner") / "runner.py"
    script.write_text(CUSTOM_RUNNER)
    folder = onnx_home / "models" / "files" / GENAI
    runner = json.dumps([sys.executable, str(script)])
    for model, extra in ((CUSTOM, []), (SLOW, ["--option", "runner_timeout=1"])):
        done = werk(onnx_home, "models", "import", str(folder), "--id", model,
                    "--backend", "onnx-runner", "--option", f"runner={runner}", *extra)  # fmt: skip
        assert done.returncode == 0, done.stderr
    return onnx_home


def _serve(home: Path, cache_size: str = "1") -> Iterator[WerkServer]:
    extra = {
        "WERK_BACKENDS_DIR": require_backends(),
        "WERK_ONNX_GENAI_MODEL_CACHE_SIZE": cache_size,
    }
    models = [a for m in (GENAI, GENAI_B, RUNNER, CUSTOM, SLOW) for a in ("--model", m)]
    with werk_serve(home, None, [*models, "--api-key", KEY, "--no-preload"], env=extra) as server:
        yield server


@pytest.fixture(scope="module")
def served(custom_home: Path) -> Iterator[WerkServer]:
    yield from _serve(custom_home)


def _text(response: object) -> str:
    body = response.json()  # type: ignore[attr-defined]
    return str(body["choices"][0]["message"]["content"])


def test_onnx_genai_streams_what_it_answers_whole(served: WerkServer) -> None:
    whole = chat(served, GENAI)
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["finish_reason"] == "length"
    assert whole.json()["usage"]["completion_tokens"] == 12
    streamed = chat(served, GENAI, stream=True)
    payloads = events(streamed)
    text = "".join(p["choices"][0]["delta"].get("content") or "" for p in payloads)
    assert text == _text(whole) and payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_the_reference_runner_answers_what_the_worker_answers(served: WerkServer) -> None:
    for fields in ({"return_token_ids": True}, {"temperature": 0.9, "seed": 5, "top_p": 0.95}):
        worker, runner = chat(served, GENAI, **fields), chat(served, RUNNER, **fields)
        assert worker.status_code == runner.status_code == 200, runner.text
        assert worker.json()["choices"] == runner.json()["choices"]
    assert len(worker.json()["choices"][0]["message"]["content"]) > 0
    row = residency(served, RUNNER, "onnx-runner")
    assert row["status"] == "unsupported" and "started for each request" in row["reason"]
    assert served.children("werk_onnx/_runner.py", "onnx-runner") == []  # each one exited


def test_a_custom_runner_gets_the_request_and_its_answer_is_relayed(served: WerkServer) -> None:
    answered = chat(served, CUSTOM, messages=[{"role": "user", "content": "ping"}], max_tokens=5)
    assert answered.status_code == 200, answered.text
    assert _text(answered) == f"{GENAI} 5 ping "
    assert answered.json()["choices"][0]["finish_reason"] == "stop"


def test_a_failing_runner_is_a_backend_error_with_its_stderr(served: WerkServer) -> None:
    failed = chat(served, CUSTOM, messages=[{"role": "user", "content": "fail"}])
    assert failed.status_code == 502, failed.text
    message = failed.json()["error"]["message"]
    assert "the onnx-runner runner failed: broken on purpose; (status 3)" in message
    assert "Traceback: the runner broke" in message


def test_the_runner_timeout_kills_a_runner_that_hangs(served: WerkServer) -> None:
    started = time.monotonic()
    hung = chat(served, SLOW, messages=[{"role": "user", "content": "sleep"}])
    assert hung.status_code == 504, hung.text
    assert time.monotonic() - started < 30
    assert served.children("runner.py", "onnx-runner") == []


def test_a_worker_killed_mid_generation_fails_and_the_next_request_starts_cold(
    served: WerkServer,
) -> None:
    assert chat(served, GENAI).status_code == 200
    (worker,) = served.children("werk_onnx/_worker.py", "onnx-genai")
    with served.client(KEY, timeout=300) as http:
        body = {"model": GENAI, "messages": [{"role": "user", "content": "Hello"}],
                "max_tokens": 2000, "temperature": 0, "stream": True}  # fmt: skip
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert [next(lines) for _ in range(4)]
            worker.send_signal(signal.SIGKILL)
            rest = list(lines)
    assert any("the onnx-genai worker exited during execute" in line for line in rest), rest[-3:]
    assert residency(served, GENAI, "onnx-genai")["reason"].startswith("no onnx-genai worker")
    assert chat(served, GENAI).status_code == 200
    (fresh,) = served.children("werk_onnx/_worker.py", "onnx-genai")
    assert fresh.pid != worker.pid


def _long_stream(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2000, "temperature": 0, "stream": True}  # fmt: skip


def test_a_runner_killed_mid_generation_fails_and_the_next_request_works(
    served: WerkServer,
) -> None:
    with (
        served.client(KEY, timeout=300) as http,
        http.stream("POST", "/v1/chat/completions", json=_long_stream(RUNNER)) as response,
    ):
        lines = response.iter_lines()
        assert [next(lines) for _ in range(4)]
        (runner,) = served.children("werk_onnx/_runner.py", "onnx-runner")
        runner.send_signal(signal.SIGKILL)
        rest = list(lines)
    assert any("the onnx-runner runner exited without a result" in line for line in rest)
    assert chat(served, RUNNER).status_code == 200


def test_sigkill_of_werk_serve_mid_generation_leaves_no_runner(custom_home: Path) -> None:
    for server in _serve(custom_home):
        with (
            server.client(KEY, timeout=300) as http,
            http.stream("POST", "/v1/chat/completions", json=_long_stream(RUNNER)) as reply,
        ):
            lines = reply.iter_lines()
            assert [next(lines) for _ in range(4)]
            (runner,) = server.children("werk_onnx/_runner.py", "onnx-runner")
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
        runner.wait(timeout=30)  # its parent's death signal: no runner outlives werk serve
        assert not psutil.pid_exists(runner.pid) or runner.status() == psutil.STATUS_ZOMBIE


def _lru(home: Path, cache_size: str) -> tuple[str, str]:
    for server in _serve(home, cache_size):
        assert chat(server, GENAI).status_code == 200
        assert chat(server, GENAI_B).status_code == 200
        return (
            residency(server, GENAI, "onnx-genai")["reason"],
            residency(server, GENAI_B, "onnx-genai")["reason"],
        )
    raise AssertionError("werk serve did not start")


def test_with_one_model_slot_the_second_model_evicts_the_first(custom_home: Path) -> None:
    a, b = _lru(custom_home, "1")
    assert a.startswith("its model is not loaded now")
    assert b.startswith("its model is resident") and "keeps 1 of at most 1 model(s)" in b


def test_with_two_model_slots_both_stay_loaded(custom_home: Path) -> None:
    a, b = _lru(custom_home, "2")
    assert a.startswith("its model is resident") and "keeps 2 of at most 2 model(s)" in b
    held = int(re.search(r", (\d+) bytes of ONNX files", b).group(1))  # type: ignore[union-attr]
    files = sum(
        p.stat().st_size
        for m in (GENAI, GENAI_B)
        for p in (custom_home / "models" / "files" / m).iterdir()
        if p.name.endswith((".onnx", ".data"))
    )
    assert held == files


def test_sigkill_of_werk_serve_leaves_no_worker(custom_home: Path) -> None:
    others = {p.pid for p in psutil.process_iter()}  # the module's server's worker too
    for server in _serve(custom_home):
        assert chat(server, GENAI).status_code == 200
        pids = {p.pid for p in server.children("werk_onnx/_worker.py", "onnx-genai")} - others
        assert len(pids) == 1
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(
            psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            for pid in pids
        )


@pytest.mark.parametrize(("backend", "model"), [("onnx-genai", GENAI), ("onnx-runner", RUNNER)])
def test_the_conformance_kit_passes_from_a_shell(onnx_home: Path, backend: str, model: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(onnx_home), WERK_BACKENDS_DIR=require_backends())
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", backend, "--model", model],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ passed, 0 failed", done.stdout)
