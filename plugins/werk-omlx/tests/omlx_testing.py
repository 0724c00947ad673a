"""Helpers for the werk-omlx tests that run the oMLX stand-in (``omlx_standin/``: oMLX's CLI,
routes and JSON shapes with real MLX inference on the CPU; it stands for oMLX, which runs only
on macOS on Apple silicon)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from werk.testing.server import WerkServer

WERK = Path(sys.executable).parent / "werk"
STANDIN = Path(__file__).with_name("omlx_standin") / "standin_omlx.py"
GENERATOR = Path(__file__).with_name("omlx_standin") / "tiny_mlx_model.py"
MODEL = "tiny-mlx"
KEY, OTHER_KEY = "omlx-key-0123456789abcdef", "omlx-key-other-9876543210"
SYSTEM = (
    "You are the assistant of a test suite. This system prompt is long on purpose, so that a "
    "second request with the same prompt can reuse the cached prefix of the first one. " * 3
)


def write_omlx(directory: Path) -> Path:
    """An ``omlx`` executable that runs the stand-in with this interpreter (which has MLX)."""
    directory.mkdir(parents=True, exist_ok=True)
    executable = directory / "omlx"
    executable.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" "$@"\n')
    executable.chmod(0o755)
    return executable


def werk(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "OMLX_"))}
    env.update(WERK_HOME=str(home), **extra)
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def chat(server: WerkServer, user: str, key: str = KEY, **fields: Any) -> Any:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 4,
        "temperature": 0,
        **fields,
    }
    with server.client(key, timeout=120) as http:
        return http.post("/v1/chat/completions", json=body)


def workers(home: Path) -> list[psutil.Process]:
    """Live stand-in workers whose directory is under ``home`` (not other servers')."""
    root = str(home / "backends" / "omlx" / "workers")
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if (
                any(part.endswith("standin_omlx.py") for part in cmdline)
                and "serve" in cmdline
                and proc.info["status"] != psutil.STATUS_ZOMBIE
                and proc.cwd().startswith(root)
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def residency(server: WerkServer) -> dict[str, Any]:
    with server.client(KEY) as http:
        rows = http.get("/werk/v1/capabilities", params={"model": MODEL}).json()["capabilities"]
    return next(r for r in rows if r["id"] == "runtime.model_residency")
