"""MLX (mlx-lm, the CPU build) for real behind a real ``werk serve``: backend ``mlx`` starts a
runner process for each request (the seed's MLX row: no resident model, the process reloads).
The demo is the host's tiny Llama, loaded by ``mlx_lm.load`` as it is."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

WERK = Path(sys.executable).parent / "werk"
MODEL = "tiny-mlx"
KEY = "mlx-key-0123456789abcdef"


def _backends() -> str:
    backends = os.environ.get("WERK_BACKENDS_DIR", "")
    if not backends:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make mlx-env)")
    return backends


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    return env | {"WERK_HOME": str(home), "WERK_BACKENDS_DIR": _backends()}


@pytest.fixture(scope="module")
def mlx_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("mlx") / "home"
    home.mkdir()
    made = subprocess.run(
        [str(WERK), "models", "create-demo", "--kind", "mlx", "--id", MODEL],
        env=_env(home), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return home


@pytest.fixture(scope="module")
def served(mlx_home: Path) -> Iterator[WerkServer]:
    args = ["--model", MODEL, "--api-key", KEY]
    with werk_serve(mlx_home, None, args, env={"WERK_BACKENDS_DIR": _backends()}) as server:
        yield server


def _chat(server: WerkServer, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 12, "temperature": 0} | fields  # fmt: skip
    with server.client(KEY, timeout=300) as http:
        return http.post("/v1/chat/completions", json=body)


def _runners(server: WerkServer) -> list[psutil.Process]:
    return server.children("werk_mlx/_runner.py", "mlx")


def test_a_chat_streamed_and_not_from_a_runner_per_request(served: WerkServer) -> None:
    whole = _chat(served)
    assert whole.status_code == 200, whole.text
    text = whole.json()["choices"][0]["message"]["content"]
    assert whole.json()["usage"]["completion_tokens"] == 12
    streamed = _chat(served, stream=True)
    lines = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == text
    assert _runners(served) == []  # each runner exited with its request
    row = served.capability(MODEL, "mlx", "runtime.model_residency", KEY)
    assert row["status"] == "unsupported" and "nothing stays loaded" in row["reason"]


def test_a_seed_reproduces_a_sampled_answer(served: WerkServer) -> None:
    first = _chat(served, temperature=1.0, seed=11).json()["choices"]
    assert first == _chat(served, temperature=1.0, seed=11).json()["choices"]


def test_a_runner_killed_mid_generation_fails_and_the_next_request_works(
    served: WerkServer,
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2000, "temperature": 0, "stream": True}  # fmt: skip
    with (
        served.client(KEY, timeout=300) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert [next(lines) for _ in range(4)]
        (runner,) = _runners(served)
        runner.send_signal(signal.SIGKILL)
        rest = list(lines)
    assert any("the mlx runner exited without a result" in line for line in rest), rest[-3:]
    assert _chat(served).status_code == 200


def test_a_client_that_leaves_ends_its_runner(served: WerkServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2000, "temperature": 0, "stream": True}  # fmt: skip
    with (
        served.client(KEY, timeout=300) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert [next(lines) for _ in range(4)]
        (runner,) = _runners(served)
    runner.wait(timeout=30)  # the client went: Werk kills the runner's process group
    assert _runners(served) == []


def test_the_conformance_kit_passes_from_a_shell(mlx_home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", "mlx", "--model", MODEL],
        env=_env(mlx_home), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ passed, 0 failed", done.stdout)
