"""The generated demo GGUF: deterministic, well-formed, and served by the real llama-server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from werk_llamacpp.demo import CHAT_TEMPLATE, EOS, IM_END, IM_START, create_demo_model
from werk_llamacpp.executable import locate_llama_server

from werk import InvalidRequest


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    assert field is not None, f"{key} missing"
    return field.contents()


def test_same_seed_is_byte_identical_and_other_seed_differs(tmp_path: Path) -> None:
    a = create_demo_model(tmp_path / "a.gguf", seed=7)
    b = create_demo_model(tmp_path / "b.gguf", seed=7)
    c = create_demo_model(tmp_path / "c.gguf", seed=8)
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.sha256 == b.sha256 != c.sha256
    assert a.path.read_bytes() != c.path.read_bytes()
    assert (a.seed, a.size, a.n_bytes) == (7, "tiny", a.path.stat().st_size)
    assert 300_000 < a.n_params < 1_000_000
    assert not list(tmp_path.glob(".*.tmp")), "temporary file left behind"


def test_gguf_reads_back_as_llama_with_byte_level_bpe_and_chatml(tmp_path: Path) -> None:
    info = create_demo_model(tmp_path / "m.gguf")
    reader = gguf.GGUFReader(info.path)
    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "llama.context_length") >= 2048 + 256
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "default"
    tokens: list[str] = _field(reader, "tokenizer.ggml.tokens")
    types: list[int] = _field(reader, "tokenizer.ggml.token_type")
    assert len(tokens) == len(types) == _field(reader, "llama.vocab_size")
    assert tokens[ord("a")] == "a" and tokens[ord(" ")] == "Ġ" and len(set(tokens[:256])) == 256
    merges: list[str] = _field(reader, "tokenizer.ggml.merges")
    assert merges and all(m.replace(" ", "", 1) in tokens for m in merges)
    for special in (EOS, IM_START, IM_END):
        assert types[tokens.index(special)] == gguf.TokenType.CONTROL
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == EOS
    assert _field(reader, "tokenizer.chat_template") == CHAT_TEMPLATE
    assert sum(int(np.prod(t.shape)) for t in reader.tensors) == info.n_params

    output = next(t for t in reader.tensors if t.name == "output.weight").data
    row_is_zero = np.asarray(~output.any(axis=1), dtype=bool)
    printable = [i for i in range(256) if 0x20 <= i <= 0x7E]
    assert not row_is_zero[printable].any()
    assert row_is_zero[[0, ord("\n"), 0x80, 0xFF, tokens.index(EOS), tokens.index(IM_END)]].all()


@pytest.mark.parametrize("kwargs", [{"size": "huge"}, {"seed": -1}, {"seed": 2**63}])
def test_invalid_arguments_are_rejected(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        create_demo_model(tmp_path / "x.gguf", **kwargs)
    assert not list(tmp_path.iterdir())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        result: dict[str, Any] = json.load(response)
        return result


@pytest.mark.slow
def test_real_llama_server_serves_printable_greedy_text(tmp_path: Path) -> None:
    located = locate_llama_server()
    if located.path is None:
        pytest.skip("llama-server not built here; `make llama-server` builds it")
    model = create_demo_model(tmp_path / "tiny.gguf", seed=3)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    args = [str(located.path), "-m", str(model.path), "--host", "127.0.0.1", "--port", str(port)]
    args += ["-c", "4096", "--cache-ram", "0", "--no-warmup"]
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.2)
        body = {"prompt": "hello", "n_predict": 8, "temperature": 0, "cache_prompt": True}
        first = _post(f"{base}/completion", body)
        assert first["content"] and first["content"].isprintable(), first["content"]
        assert first["timings"]["predicted_n"] == 8
        again = _post(f"{base}/completion", body)
        assert again["content"] == first["content"], "greedy output is not reproducible"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
