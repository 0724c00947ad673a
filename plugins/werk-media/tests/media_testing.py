"""Helpers for the tests that run the real media worker (torch, Diffusers in the managed
environment). They fail (never skip) without ``WERK_BACKENDS_DIR``: ``make test`` installs the
environment first (``make media-env``)."""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from PIL import Image

from werk.testing.server import WerkServer

WERK = Path(sys.executable).parent / "werk"
BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")
IMAGE_A, IMAGE_B = "tiny-image", "tiny-image-b"
TTS, ASR = "tiny-tts", "tiny-asr"
QWEN = "tiny-qwen"
CLASSIFY = "tiny-classify"
KEY = "media-key-0123456789abcdef"


def require_backends() -> str:
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make media-env)")
    return BACKENDS


def werk(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=require_backends(), **extra)
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )


def generate(server: WerkServer, model: str = IMAGE_A, **fields: Any) -> httpx.Response:
    body: dict[str, Any] = {
        "model": model,
        "prompt": "a red cat",
        "size": "64x64",
        "response_format": "b64_json",
        "seed": 1,
    }
    body.update(fields)
    with server.client(KEY, timeout=600) as http:
        return http.post("/v1/images/generations", json=body)


def png_of(response: httpx.Response) -> tuple[bytes, Image.Image]:
    assert response.status_code == 200, response.text
    (item,) = response.json()["data"]
    raw = base64.b64decode(item["b64_json"])
    image = Image.open(io.BytesIO(raw))
    image.load()  # decodes every pixel: a truncated or corrupt PNG fails here
    return raw, image


def workers(home: Path, kind: str = "media") -> list[psutil.Process]:
    """Live workers of ``kind`` (``media``, ``qwen-tts``) of the ``werk serve`` using ``home``
    (their working directory is under ``home/backends/<kind>-runs``), not those of other
    servers on the machine."""
    runs = str(home / "backends" / f"{kind}-runs")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if (
                len(cmdline) >= 2
                and cmdline[1].endswith("werk_media/_worker.py")
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.cwd().startswith(runs)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def residency(server: WerkServer, model: str, backend: str = "media") -> dict[str, Any]:
    with server.client(KEY) as http:
        answer = http.get("/werk/v1/capabilities", params={"model": model})
    assert answer.status_code == 200, answer.text
    rows = answer.json()["capabilities"]
    return next(r for r in rows if r["backend"] == backend and r["id"] == "runtime.model_residency")
