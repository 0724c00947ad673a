"""Helpers for the tests that run the real Transformers worker (torch and Transformers in the
managed environment). They fail (never skip) without ``WERK_BACKENDS_DIR``: ``make test``
installs the environment first (``make transformers-env``)."""

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
MODEL_A, MODEL_B = "tiny-llama", "tiny-llama-b"
KEY = "transformers-key-0123456789abcdef"


def require_backends() -> str:
    if not BACKENDS:
        pytest.fail(
            "WERK_BACKENDS_DIR is not set: run the suite with `make test` (make transformers-env)"
        )
    return BACKENDS


def werk(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=require_backends(), **extra)
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def chat_body(model: str = MODEL_A, text: str = "Hello", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 12,
        "temperature": 0,
    }
    return body | fields


def chat(server: WerkServer, model: str = MODEL_A, **fields: Any) -> httpx.Response:
    with server.client(KEY, timeout=300) as http:
        return http.post("/v1/chat/completions", json=chat_body(model, **fields))


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The ``data`` payloads of an SSE response (``[DONE]`` last, checked and dropped)."""
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", response.text[-500:]
    return [json.loads(line) for line in lines[:-1]]


def streamed_text(payloads: list[dict[str, Any]]) -> str:
    return "".join(
        str(choice.get("delta", {}).get("content") or choice.get("text") or "")
        for payload in payloads
        for choice in payload.get("choices", [])
    )


def workers(server: WerkServer) -> list[psutil.Process]:
    """The server's live Transformers workers."""
    return server.children("werk_transformers/_worker.py", "transformers")


def residency(server: WerkServer, model: str) -> dict[str, Any]:
    row: dict[str, Any] = server.capability(model, "transformers", "runtime.model_residency", KEY)
    return row
