"""Helpers for the tests that run a real vLLM (CPU build, managed environment).

They fail (never skip) without ``WERK_BACKENDS_DIR``: ``make test`` installs vLLM into the
cached managed environment first (``make vllm-env``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from werk.testing.server import WerkServer

WERK = Path(sys.executable).parent / "werk"
BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")
MODEL = "tiny-vllm"
KEY_A, KEY_B = "vllm-key-alpha-0123456789", "vllm-key-bravo-9876543210"
LONG = "lorem ipsum dolor sit amet " * 20  # ~560 tokens with the byte-level tokenizer
_HITS = re.compile(r"^vllm:prefix_cache_hits_total(?:\{[^}]*\})?\s+([0-9.eE+]+)", re.M)


def require_backends() -> str:
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make vllm-env)")
    return BACKENDS


def werk_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=require_backends(), **extra)
    return env


def werk(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WERK), *args], env=werk_env(home, **extra), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def processes(marker: str) -> list[psutil.Process]:
    """Live processes whose command line contains ``marker`` (zombies excluded)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def api_servers(marker: str) -> list[psutil.Process]:
    """vLLM API servers whose command line contains ``marker`` (not Werk's guardian, whose
    command line carries the same arguments)."""
    found = []
    for proc in processes(marker):
        try:
            if proc.cmdline()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def family(servers: list[psutil.Process]) -> set[int]:
    """The servers and everything they started (the engine core, its workers)."""
    pids = {p.pid for p in servers}
    for proc in servers:
        pids |= {child.pid for child in proc.children(recursive=True)}
    return pids


def alive(pids: set[int]) -> list[int]:
    living = []
    for pid in sorted(pids):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                living.append(pid)
        except psutil.NoSuchProcess:
            continue
    return living


def wait_gone(pids: set[int], timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(pids)


def port_of(server: psutil.Process) -> int:
    cmdline = server.cmdline()
    return int(cmdline[cmdline.index("--port") + 1])


def prefix_cache_hits(port: int) -> float:
    """vLLM's own counter, read from its ``/metrics`` (not behind its API key)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = _HITS.findall(text)
    assert values, "vLLM's /metrics has no vllm:prefix_cache_hits_total"
    return sum(float(v) for v in values)


def chat(server: WerkServer, content: str, key: str = KEY_A, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {
        "model": extra.pop("model", MODEL),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
    }
    body.update(extra)
    with server.client(key, timeout=600) as http:
        return http.post("/v1/chat/completions", json=body)


def cached(usage: dict[str, Any]) -> int:
    details = usage.get("prompt_tokens_details") or {}
    assert isinstance(details, dict)
    return int(details.get("cached_tokens") or 0)


def rows(server: WerkServer, model: str, backend: str, key: str = KEY_A) -> dict[str, Any]:
    with server.client(key) as http:
        answer = http.get("/werk/v1/capabilities", params={"model": model})
    assert answer.status_code == 200, answer.text
    return {r["id"]: r for r in answer.json()["capabilities"] if r["backend"] == backend}
