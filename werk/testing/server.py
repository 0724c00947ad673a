"""A real ``werk serve`` on loopback, for end-to-end tests of a backend.

:func:`werk_serve` starts ``werk serve --host 127.0.0.1 --port <free> ARGS`` as a subprocess with
its own ``WERK_HOME``, waits until ``GET /werk/v1/health`` answers, yields a :class:`WerkServer`
and stops it (SIGTERM, then SIGKILL) afterwards. The environment is the test's, without any
``WERK_*`` or ``PYTEST_*`` variable, plus ``WERK_HOME`` and what you pass; ``site`` puts a
``pip install --target`` directory on ``PYTHONPATH`` so a plugin installed there is found
through its entry point. Use it from your plugin's tests::

    from werk.testing.server import werk_serve

    def test_my_backend_under_werk_serve(tmp_path):
        home = tmp_path / "home"; home.mkdir()
        with werk_serve(home, ["--model", "demo"]) as server, server.client() as http:
            assert http.get("/werk/v1/info").status_code == 200
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from ..supervise import free_port

__all__ = ["WERK", "WerkServer", "server_env", "werk_serve"]


def _werk_script() -> Path:
    beside = Path(sys.executable).parent / "werk"
    if beside.exists():
        return beside
    found = shutil.which("werk")
    return Path(found) if found else beside


WERK = _werk_script()
"""The ``werk`` console script of the running interpreter's environment."""


def server_env(
    home: Path, site: Path | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment a test's ``werk`` subprocess gets (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTEST_"))}
    env["WERK_HOME"] = str(home)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra or {})
    return env


@dataclass
class WerkServer:
    """A running ``werk serve`` process."""

    process: subprocess.Popen[bytes]
    base_url: str
    home: Path
    log_path: Path
    api_keys: Sequence[str] = field(default_factory=list)

    def client(self, key: str | None = None, **kwargs: Any) -> httpx.Client:
        """An ``httpx.Client`` for the server (with ``Authorization: Bearer KEY`` if given)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        kwargs.setdefault("timeout", 30)
        return httpx.Client(base_url=self.base_url, headers=headers, **kwargs)

    def log(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def capability(self, model: str, backend: str, row: str, key: str | None = None) -> Any:
        """``backend``'s capability row ``row`` for ``model`` (``GET /werk/v1/capabilities``)."""
        with self.client(key) as http:
            answer = http.get("/werk/v1/capabilities", params={"model": model})
        answer.raise_for_status()
        rows = answer.json()["capabilities"]
        return next(r for r in rows if r["backend"] == backend and r["id"] == row)

    def children(self, script: str, kind: str) -> list[psutil.Process]:
        """The live processes running ``script`` (a path suffix: ``werk_onnx/_worker.py``) that
        this server started for backend ``kind``: their working directory is under
        ``home/backends/<kind>-runs`` (a companion worker's or a runner's run directory)."""
        runs = str(self.home / "backends" / f"{kind}-runs")
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                cmdline = proc.info["cmdline"] or []
                if (
                    len(cmdline) >= 2
                    and cmdline[1].endswith(script)
                    and proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.cwd().startswith(runs)
                ):
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send ``sig``, wait up to ``timeout`` seconds (then SIGKILL); the exit status."""
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
    site: Path | None = None,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 30,
) -> Iterator[WerkServer]:
    """Start ``werk serve --host 127.0.0.1 --port <free> ARGS`` and wait until
    ``/werk/v1/health`` answers; stop it (SIGTERM, then SIGKILL) when the block ends.

    :param home: the server's ``WERK_HOME`` (the parent directory also receives its log).
    :param site: a directory put on the server's ``PYTHONPATH`` (a ``pip install --target``
        of a plugin under test), or ``None``.
    :param args: more ``werk serve`` arguments (``--model demo``, ``--api-key-env …``).
    :param env: extra environment variables (the rest is the test's, without ``WERK_*``).
    :param startup_timeout: seconds to wait for health before failing with the server's log.
    :yields: a :class:`WerkServer`: ``base_url`` (``http://127.0.0.1:<port>``), ``process``,
        ``home``, ``client(key)`` (an ``httpx.Client`` with that bearer key), ``log()`` (all
        the server wrote to stdout and stderr, in ``<home>/../werk-serve-<port>.log``) and
        ``stop(sig)`` (its exit status).
    :raises RuntimeError: the server exited or did not answer in time (with its log).
    """
    port = free_port()
    log_path = home.parent / f"werk-serve-{port}.log"
    with log_path.open("wb") as log:
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
