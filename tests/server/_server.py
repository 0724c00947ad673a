"""Starting a real ``werk serve`` subprocess on loopback for end-to-end tests.

The test backend (``tests/test_backend``, distribution ``werk-test-backend``) is installed into
a private ``--target`` directory and put on the server's ``PYTHONPATH``: the server discovers it
through its real entry point, and the dev virtual environment is never modified.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WERK = BIN / "werk"


def install_test_backend(target: Path) -> Path:
    """``pip install --target`` the test backend; returns the site directory."""
    site = target / "site"
    if not (site / "werk_test_backend").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--target",
                str(site),
                str(REPO / "tests" / "test_backend"),
            ],
            check=True,
            cwd=target,
        )
    return site


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(
    home: Path, site: Path | None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTEST_"))}
    env["WERK_HOME"] = str(home)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra or {})
    return env


def import_model(home: Path, site: Path, model_id: str, seed_text: str = "weights") -> Path:
    """Create a testkv model file and import it with the real CLI."""
    model_file = home.parent / f"{model_id}.testkv"
    model_file.write_text(f"testkv model {model_id}: {seed_text}\n")
    subprocess.run(
        [str(WERK), "models", "import", str(model_file), "--id", model_id, "--backend", "testkv"],
        check=True,
        env=server_env(home, site),
        capture_output=True,
    )
    return model_file


@dataclass
class WerkServer:
    """A running ``werk serve`` process."""

    process: subprocess.Popen[bytes]
    base_url: str
    home: Path
    log_path: Path
    api_keys: Sequence[str] = field(default_factory=list)

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30, **kwargs)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@contextlib.contextmanager
def werk_serve(
    home: Path,
    site: Path | None,
    args: Sequence[str] = (),
    *,
    env: dict[str, str] | None = None,
    startup_timeout: float = 30,
) -> Iterator[WerkServer]:
    """Start ``werk serve --port <free> ARGS`` and wait until ``/werk/v1/health`` answers."""
    port = free_port()
    log_path = home.parent / f"werk-serve-{port}.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        [str(WERK), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        env=server_env(home, site, env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = WerkServer(process, f"http://127.0.0.1:{port}", home, log_path)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"werk serve exited {process.returncode}:\n{server.log()}")
            try:
                if httpx.get(f"{server.base_url}/werk/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"werk serve did not become ready:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        server.stop()
        log.close()
