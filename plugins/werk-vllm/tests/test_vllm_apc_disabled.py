"""``werk serve --persistence-reuse disabled`` with a real vLLM: Werk adds
``--no-enable-prefix-caching``, the row says ``unsupported``, and vLLM's own counter shows no
reuse. And a reserved flag in ``WERK_VLLM_ARGS`` is refused before anything starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_testing import (
    KEY_A,
    LONG,
    MODEL,
    api_servers,
    cached,
    chat,
    port_of,
    prefix_cache_hits,
    processes,
    require_backends,
    rows,
)

from werk.testing.server import WerkServer, werk_serve


@pytest.mark.slow
def test_a_reserved_flag_in_werk_vllm_args_is_a_clear_error_and_starts_nothing(
    vllm_home: Path,
) -> None:
    extra = {"WERK_BACKENDS_DIR": require_backends(), "WERK_VLLM_ARGS": "--port 1"}
    with werk_serve(vllm_home, None, ["--model", MODEL, "--api-key", KEY_A], env=extra) as server:
        response = chat(server, "hello")
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "invalid_request"
        assert error["message"] == "WERK_VLLM_ARGS may not set --port: Werk chooses it"
        assert processes(str(vllm_home / "models" / "files" / MODEL)) == []


@pytest.fixture(scope="module")
def served_without_reuse(vllm_home: Path) -> Iterator[WerkServer]:
    extra = {"WERK_BACKENDS_DIR": require_backends()}
    args = ["--persistence-reuse", "disabled", "--model", MODEL, "--api-key", KEY_A]
    with werk_serve(vllm_home, None, args, env=extra) as server:
        yield server


@pytest.mark.slow
def test_reuse_disabled_turns_vllms_prefix_cache_off(served_without_reuse: WerkServer) -> None:
    server = served_without_reuse
    assert chat(server, "hello").status_code == 200  # starts vLLM
    (process,) = api_servers(str(server.home / "models" / "files" / MODEL))
    assert "--no-enable-prefix-caching" in process.cmdline()
    assert "--enable-prefix-caching" not in process.cmdline()
    prefix = rows(server, MODEL, "vllm")["runtime.state.prefix_cache"]
    assert prefix["status"] == "unsupported"
    assert prefix["operations"] == []
    port = port_of(process)
    before = prefix_cache_hits(port)
    chat(server, LONG, max_tokens=1)
    again = chat(server, LONG, max_tokens=1).json()["usage"]
    assert again["prompt_tokens"] > 128
    assert cached(again) == 0
    assert prefix_cache_hits(port) == before


@pytest.mark.slow
def test_a_vllm_that_exits_during_startup_is_a_typed_error_with_its_reason(
    vllm_home: Path,
) -> None:
    """vLLM refuses a context longer than the model's (2048): it exits while starting."""
    extra = {"WERK_BACKENDS_DIR": require_backends(), "WERK_VLLM_ARGS": "--max-model-len 999999"}
    with werk_serve(vllm_home, None, ["--model", MODEL, "--api-key", KEY_A], env=extra) as server:
        response = chat(server, "hello")
        assert response.status_code == 502, response.text
        error = response.json()["error"]
        assert error["code"] == "backend_error"
        assert error["message"].startswith("vLLM exited during startup: ")
        assert "max_model_len" in error["message"] or "max-model-len" in error["message"]
        assert "exited with" in server.log()  # the log tail is in werk serve's log
        assert processes("--max-model-len 999999") == []  # nothing of it is left
