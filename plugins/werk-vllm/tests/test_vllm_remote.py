"""Backend ``vllm-remote`` against a real vLLM server that the test starts itself on loopback
(as a separately operated endpoint would run), behind ``WERK_VLLM_HOST``/``WERK_VLLM_PORT``.

Werk starts nothing for it: rows ``externally_managed`` / ``metadata_only`` while it answers,
``/v1`` relayed under Werk's model id with a per-key ``cache_salt``, its lifetime independent
of Werk's (it answers again through a new ``werk serve``), and ``unavailable`` once it stops,
without restarting Werk. The conformance kit runs against it too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from vllm_testing import (
    KEY_A,
    KEY_B,
    LONG,
    MODEL,
    cached,
    chat,
    processes,
    require_backends,
    rows,
    werk,
)

from werk import ModelRegistry, free_port
from werk.testing import ConformanceReport
from werk.testing.server import WerkServer, werk_serve

REMOTE_ID = "far-vllm"
UPSTREAM_NAME = "upstream-tiny"


class Endpoint:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.process, self.port, self.log = process, port, log

    def env(self) -> dict[str, str]:
        return {
            "WERK_BACKENDS_DIR": require_backends(),
            "WERK_VLLM_HOST": "127.0.0.1",
            "WERK_VLLM_PORT": str(self.port),
        }

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture(scope="module")
def endpoint(vllm_home: Path) -> Iterator[Endpoint]:
    """A vLLM OpenAI server started by the test, not by Werk (its own session and group)."""
    python = Path(require_backends()) / "vllm" / "venv" / "bin" / "python"
    port = free_port()
    log = vllm_home.parent / "remote-vllm.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(vllm_home / "models" / "files" / MODEL),
        "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", UPSTREAM_NAME,
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    found = Endpoint(process, port, log)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, log.read_text(errors="replace")[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the test's vLLM did not become ready"
            time.sleep(0.5)
        imported = werk(
            vllm_home, "models", "import", "--backend", "vllm-remote", "--id", REMOTE_ID
        )
        assert imported.returncode == 0, imported.stderr
        yield found
    finally:
        found.stop()


@pytest.fixture
def served(vllm_home: Path, endpoint: Endpoint) -> Iterator[WerkServer]:
    args = ["--model", REMOTE_ID, "--api-key", KEY_A, "--api-key", KEY_B]
    with werk_serve(vllm_home, None, args, env=endpoint.env()) as server:
        yield server


def _remote_processes() -> int:
    return len(processes("vllm.entrypoints.openai.api_server"))


@pytest.mark.slow
def test_an_endpoint_model_is_imported_without_files(vllm_home: Path, endpoint: Endpoint) -> None:
    manifest = ModelRegistry(vllm_home).get(REMOTE_ID)
    assert manifest.backend == "vllm-remote" and manifest.files == ()
    refused = werk(vllm_home, "models", "import", "--id", "x")  # a file backend needs files
    assert refused.returncode != 0


@pytest.mark.slow
def test_chat_through_the_remote_endpoint_under_werks_model_id(
    served: WerkServer, endpoint: Endpoint
) -> None:
    before = _remote_processes()
    response = chat(served, "hello", model=REMOTE_ID)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == REMOTE_ID  # not the endpoint's own name
    body = {
        "model": REMOTE_ID,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 4,
        "stream": True,
    }
    with (
        served.client(KEY_A, timeout=600) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as streamed,
    ):
        assert streamed.status_code == 200
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert all(json.loads(line[6:])["model"] == REMOTE_ID for line in lines[:-1])
    assert _remote_processes() == before  # Werk started nothing


@pytest.mark.slow
def test_rows_while_the_endpoint_answers(served: WerkServer) -> None:
    by_id = rows(served, REMOTE_ID, "vllm-remote")
    assert by_id["runtime.model_residency"]["status"] == "externally_managed"
    assert by_id["runtime.state.prefix_cache"]["status"] == "metadata_only"
    assert by_id["runtime.state.persistence"]["status"] == "unsupported"
    assert by_id["runtime.pd.handoff"]["status"] == "unsupported"


@pytest.mark.slow
def test_the_remote_gets_werks_per_key_cache_salt(served: WerkServer) -> None:
    chat(served, LONG, KEY_A, model=REMOTE_ID, max_tokens=1)
    again = chat(served, LONG, KEY_A, model=REMOTE_ID, max_tokens=1).json()["usage"]
    assert cached(again) >= 128
    other = chat(served, LONG, KEY_B, model=REMOTE_ID, max_tokens=1).json()["usage"]
    assert cached(other) == 0


@pytest.mark.slow
def test_the_endpoint_outlives_werk(vllm_home: Path, endpoint: Endpoint) -> None:
    """A new ``werk serve`` finds it answering; Werk's lifetime is not the endpoint's."""
    for _ in range(2):
        args = ["--model", REMOTE_ID, "--api-key", KEY_A]
        with werk_serve(vllm_home, None, args, env=endpoint.env()) as server:
            assert chat(server, "hello", model=REMOTE_ID).status_code == 200
        assert endpoint.process.poll() is None


@pytest.mark.slow
def test_the_remote_passes_the_conformance_kit(
    vllm_home: Path,
    endpoint: Endpoint,
    werk_conformance: Callable[..., ConformanceReport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in endpoint.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "kit-home"))
    report = werk_conformance("vllm-remote", ModelRegistry(vllm_home).get(REMOTE_ID).spec())
    passed = {c.name for c in report.checks if c.passed}
    assert {"/v1 streamed chat completion", "/v1 stream closed by the client"} <= passed
    assert "/v1 malformed request refused" in passed, report.summary()


@pytest.mark.slow
def test_a_stopped_endpoint_is_unavailable_without_restarting_werk(
    served: WerkServer, endpoint: Endpoint
) -> None:
    assert chat(served, "hello", model=REMOTE_ID).status_code == 200
    endpoint.stop()
    by_id = rows(served, REMOTE_ID, "vllm-remote")
    assert by_id["runtime.model_residency"]["status"] == "unavailable"
    assert "does not answer /health" in by_id["runtime.model_residency"]["reason"]
    assert by_id["runtime.state.prefix_cache"]["status"] == "unavailable"
    response = chat(served, "hello", model=REMOTE_ID)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "unavailable"
    with served.client(KEY_A) as http:
        assert http.get("/werk/v1/health").status_code == 200  # Werk itself is fine


@pytest.mark.slow
def test_werk_vllm_args_next_to_an_endpoint_is_a_configuration_error(
    vllm_home: Path, endpoint: Endpoint
) -> None:
    extra = {**endpoint.env(), "WERK_VLLM_ARGS": "--enable-prefix-caching"}
    with werk_serve(vllm_home, None, ["--model", REMOTE_ID, "--api-key", KEY_A], env=extra) as s:
        response = chat(s, "hello", model=REMOTE_ID)
    assert response.status_code == 400
    assert "Werk starts no process" in response.json()["error"]["message"]
