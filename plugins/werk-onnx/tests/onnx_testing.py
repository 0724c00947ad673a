"""Helpers for the tests that run ONNX Runtime GenAI for real (the managed onnx environment).
They fail (never skip) without ``WERK_BACKENDS_DIR``: ``make test`` installs the environment
first (``make onnx-env``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from werk.testing.server import WerkServer

WERK = Path(sys.executable).parent / "werk"
BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")
GENAI, GENAI_B, RUNNER = "tiny-onnx", "tiny-onnx-b", "tiny-onnx-runner"
KEY = "onnx-key-0123456789abcdef"


def require_backends() -> str:
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make onnx-env)")
    return BACKENDS


def werk(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=require_backends(), **extra)
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def chat(server: WerkServer, model: str, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    with server.client(KEY, timeout=300) as http:
        return http.post("/v1/chat/completions", json=body | fields)


def events(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", response.text[-500:]
    return [json.loads(line) for line in lines[:-1]]


def residency(server: WerkServer, model: str, backend: str) -> dict[str, Any]:
    row: dict[str, Any] = server.capability(model, backend, "runtime.model_residency", KEY)
    return row
