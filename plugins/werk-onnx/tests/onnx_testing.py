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
import psutil
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


def processes(home: Path, kind: str, script: str) -> list[psutil.Process]:
    """Live ``script`` processes (``_worker.py``, ``_runner.py``) of the ``werk serve`` using
    ``home`` (working directory under ``home/backends/<kind>-runs``)."""
    runs = str(home / "backends" / f"{kind}-runs")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if (
                len(cmdline) >= 2
                and cmdline[1].endswith(f"werk_onnx/{script}")
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.cwd().startswith(runs)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def residency(server: WerkServer, model: str, backend: str) -> dict[str, Any]:
    with server.client(KEY) as http:
        answer = http.get("/werk/v1/capabilities", params={"model": model})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["capabilities"]
    return next(r for r in rows if r["backend"] == backend and r["id"] == "runtime.model_residency")
