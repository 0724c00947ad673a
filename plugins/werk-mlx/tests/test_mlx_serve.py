"""MLX (mlx-lm, the CPU build) for real behind a real ``werk serve``: backend ``mlx`` starts a
runner process for each request (the seed's MLX row: no resident model, the process reloads).
The demo is the host's tiny Llama, loaded by ``mlx_lm.load`` as it is."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

WERK = Path(sys.executable).parent / "werk"
MODEL, VLM = "tiny-mlx", "tiny-vlm"
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
    for kind, model in (("mlx", MODEL), ("mlx-vlm", VLM)):
        made = subprocess.run(
            [str(WERK), "models", "create-demo", "--kind", kind, "--id", model],
            env=_env(home), capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
    return home


@pytest.fixture(scope="module")
def served(mlx_home: Path) -> Iterator[WerkServer]:
    args = ["--model", MODEL, "--model", VLM, "--api-key", KEY]
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


def test_sigkill_of_werk_serve_mid_generation_leaves_no_runner(mlx_home: Path) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 2000, "temperature": 0, "stream": True}  # fmt: skip
    args = ["--model", MODEL, "--api-key", KEY]
    with werk_serve(mlx_home, None, args, env={"WERK_BACKENDS_DIR": _backends()}) as server:
        with (
            server.client(KEY, timeout=300) as http,
            http.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            assert [next(lines) for _ in range(4)]
            (runner,) = _runners(server)
            server.process.send_signal(signal.SIGKILL)
            server.process.wait()
        runner.wait(timeout=30)  # its parent's death signal: no runner outlives werk serve
        assert not psutil.pid_exists(runner.pid) or runner.status() == psutil.STATUS_ZOMBIE


def _png(colour: tuple[int, int, int]) -> str:
    """A 1x1 PNG of ``colour`` as a data URL (written by hand: zlib and CRC from the stdlib)."""
    raw = b"\x00" + bytes(colour)
    chunks = [
        (b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)),
        (b"IDAT", zlib.compress(raw)),
        (b"IEND", b""),
    ]
    body = b"".join(
        struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        for kind, data in chunks
    )
    return "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + body).decode()


def _ask(served: WerkServer, colour: tuple[int, int, int] | None, **fields: Any) -> Any:
    content: list[dict[str, Any]] = [{"type": "text", "text": "What colour is this?"}]
    if colour is not None:
        content.append({"type": "image_url", "image_url": {"url": _png(colour)}})
    body = {"model": VLM, "messages": [{"role": "user", "content": content}],
            "max_tokens": 10, "temperature": 0} | fields  # fmt: skip
    with served.client(KEY, timeout=300) as http:
        return http.post("/v1/chat/completions", json=body)


def test_mlx_vlm_answers_about_an_image_and_the_image_matters(served: WerkServer) -> None:
    red = _ask(served, (255, 0, 0))
    assert red.status_code == 200, red.text
    usage = red.json()["usage"]
    text_only = _ask(served, None).json()
    assert usage["prompt_tokens"] == text_only["usage"]["prompt_tokens"] + 17  # 16 + newline
    answers = {
        colour: _ask(served, colour).json()["choices"][0]["message"]["content"]
        for colour in ((255, 0, 0), (0, 0, 255))
    }
    assert answers[(255, 0, 0)] == red.json()["choices"][0]["message"]["content"]  # greedy
    assert answers[(255, 0, 0)] != answers[(0, 0, 255)]  # the pixels reach the model
    streamed = _ask(served, (255, 0, 0), stream=True)
    lines = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    chunks = [json.loads(line) for line in lines[:-1]]
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        == answers[(255, 0, 0)]
    )
    remote = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    with served.client(KEY) as http:
        refused = http.post(
            "/v1/chat/completions",
            json={"model": VLM, "messages": [{"role": "user", "content": [remote]}]},
        )
    assert refused.status_code == 400 and "fetches no remote image" in refused.text
    with served.client(KEY) as http:
        text_model = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": _png((1, 2, 3))}}]}]},
        )  # fmt: skip
    assert text_model.status_code == 501 and "serves text" in text_model.text


@pytest.mark.parametrize(("backend", "model"), [("mlx", MODEL), ("mlx-vlm", VLM)])
def test_the_conformance_kit_passes_from_a_shell(mlx_home: Path, backend: str, model: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", backend, "--model", model],
        env=_env(mlx_home), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b\d+ passed, 0 failed", done.stdout)
