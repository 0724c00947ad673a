"""Helpers (no tests) for the process-layer tests: the real llama-server, the demo model,
stand-in wrapper executables, a real ``werk serve`` subprocess and process-table checks.

Tests using a real llama-server are ``slow`` and skip only when no executable can be located.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from werk_llamacpp.demo import create_demo_model
from werk_llamacpp.executable import locate_llama_server
from werk_llamacpp.inspect import FileIdentity, Inspection

from werk import ModelSpec

LOCATED = locate_llama_server()
LLAMA_SERVER = LOCATED.path
BIN = Path(sys.executable).parent
WERK = BIN / "werk"

needs_llama_server = pytest.mark.skipif(
    LLAMA_SERVER is None, reason=f"no llama-server executable could be located ({LOCATED.reason})"
)


def demo_model(directory: Path) -> Path:
    path = directory / "demo.gguf"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        create_demo_model(path, seed=0, size="tiny")
    return path


def split_demo_model(directory: Path, parts: int = 2) -> list[Path]:
    """The tiny demo model rewritten as a split GGUF (``demo-0000K-of-0000N.gguf``, the layout
    llama.cpp's ``gguf-split`` writes: every metadata key in the first part, each part with
    ``split.no``/``split.count``/``split.tensors.count``), by gguf-py's own copy and split."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(str(demo_model(directory / "whole")))
    directory.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(
        directory / "demo.gguf",
        gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA],
        split_max_tensors=-(-len(reader.tensors) // parts),
    )
    copy_with_new_metadata(reader, writer, {}, [])
    return sorted(directory.glob("demo-*-of-*.gguf"))


def spec_for(
    model: Path, options: dict[str, Any] | None = None, model_id: str = "demo"
) -> ModelSpec:
    return ModelSpec(
        id=model_id,
        backend="llamacpp",
        identity="sha256:" + "0" * 64,
        files=(model,),
        options=options or {},
    )


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes (a bound, not an assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def gone(pid: int) -> bool:
    """The process no longer runs (reaped, or a zombie waiting for its new parent)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def processes_mentioning(text: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line contains ``text``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(text in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def llama_children(pid: int | None = None) -> list[psutil.Process]:
    """Live llama-server descendants of ``pid`` (default: this test process)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE and "llama" in " ".join(child.cmdline()):
                out.append(child)
    return out


def kill_leftovers(text: str) -> None:
    for proc in processes_mentioning(text):
        with contextlib.suppress(psutil.Error):
            proc.kill()


# -- stand-in executables ---------------------------------------------------------------------


def python_wrapper(
    path: Path, body: str, direct: tuple[str, ...] = ("--version", "--list-devices")
) -> Path:
    """An executable Python script; ``REAL`` is the real llama-server, ``ARGS`` its argv.
    The ``direct`` flags (default ``--version`` and ``--list-devices``) go straight to the real
    executable, as fast as it answers them; everything else runs ``body``."""
    assert LLAMA_SERVER is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\n"
        "import os, subprocess, sys, time\n"
        f"REAL = {str(LLAMA_SERVER)!r}\n"
        "ARGS = sys.argv[1:]\n"
        f"if ARGS[:1] and ARGS[0] in {list(direct)!r}:\n"
        "    os.execv(REAL, [REAL, *ARGS])\n" + body
    )
    path.chmod(0o755)
    return path


def delayed_wrapper(path: Path, delay: float) -> Path:
    """Answers --help/--version at once; a serve waits ``delay`` s, then *becomes* (exec) the
    real llama-server (same pid: PDEATHSIG and Werk's reaping apply to it)."""
    return python_wrapper(
        path,
        f"if ARGS[:1] != ['--help']:\n    time.sleep({delay!r})\nos.execv(REAL, [REAL, *ARGS])\n",
    )


def help_filter_wrapper(path: Path, drop: str) -> Path:
    """Hides every --help line mentioning ``drop``; otherwise the real llama-server."""
    return python_wrapper(
        path,
        "if ARGS[:1] == ['--help']:\n"
        "    out = subprocess.run([REAL, '--help'], capture_output=True, text=True).stdout\n"
        f"    sys.stdout.write(''.join(l for l in out.splitlines(True) if {drop!r} not in l))\n"
        "    sys.exit(0)\n"
        "os.execv(REAL, [REAL, *ARGS])\n",
    )


def self_modifying_wrapper(path: Path) -> Path:
    """When started as a server, appends to its own file (a "rebuilt" executable), then execs."""
    return python_wrapper(
        path,
        "if ARGS[:1] != ['--help']:\n"
        "    with open(__file__, 'a') as f:\n"
        "        f.write('# replaced\\n')\n"
        "os.execv(REAL, [REAL, *ARGS])\n",
    )


# -- a real `werk serve` ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def werk_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTEST_"))}
    env["WERK_HOME"] = str(home)
    if LLAMA_SERVER is not None:
        env["WERK_LLAMA_SERVER"] = str(LLAMA_SERVER)
    env.update(extra or {})
    return env


def create_demo(home: Path, *args: str, extra_env: dict[str, str] | None = None) -> str:
    """``werk models create-demo ARGS`` with the real CLI; returns its stdout."""
    done = subprocess.run(
        [str(WERK), "models", "create-demo", *args],
        env=werk_env(home, extra_env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    base_url: str
    home: Path
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, timeout: float = 60) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout)


@contextlib.contextmanager
def werk_serve(
    home: Path,
    args: Sequence[str] = ("--model", "demo"),
    env: dict[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> Iterator[Served]:
    """``werk serve`` on a free port; waits for ``/werk/v1/health``; always stops it and
    kills any llama-server still mentioning ``home`` (so one failed test cannot leak).

    A port taken by another process between choosing and binding it is retried (other tests
    on the machine start servers too). ``preexec`` runs in the child before ``werk`` starts
    (e.g. :meth:`werk.testing.cgroups.LimitedCgroup.preexec`)."""
    served = _start_serve(home, args, env, preexec)
    for attempt in (1, 2, 3):
        try:
            ready = _wait_healthy(served)
            break
        except _PortTaken:
            if attempt == 3:
                raise AssertionError(f"no free port for werk serve:\n{served.log()}") from None
            served = _start_serve(home, args, env, preexec)
    process = served.process
    try:
        assert ready, f"werk serve did not become ready:\n{served.log()}"
        yield served
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        kill_leftovers(str(home))


class _PortTaken(Exception):
    pass


def _start_serve(
    home: Path,
    args: Sequence[str],
    env: dict[str, str] | None,
    preexec: Callable[[], None] | None = None,
) -> Served:
    port = free_port()
    log_path = home.parent / f"werk-serve-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(WERK), "serve", "--host", "127.0.0.1", "--port", str(port), *args],
            env=werk_env(home, env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
    return Served(process, f"http://127.0.0.1:{port}", home, log_path)


def _wait_healthy(served: Served) -> bool:
    return wait_until(lambda: _healthy(served), timeout=60, interval=0.1)


def _healthy(served: Served) -> bool:
    if served.process.poll() is not None:
        if "address already in use" in served.log().lower():
            raise _PortTaken
        raise AssertionError(f"werk serve exited {served.process.returncode}:\n{served.log()}")
    try:
        return httpx.get(f"{served.base_url}/werk/v1/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def inspection_stub(devices: tuple[str, ...] | None = ()) -> Inspection:
    """An inspection of no real file, with ``--list-devices``' answer ``devices``."""
    return Inspection(
        path=Path("/nonexistent/llama-server"),
        identity=FileIdentity("/nonexistent/llama-server", 0, 0, 0, 0, 0),
        sha256="0" * 64,
        help_text="",
        version_text="version: 1 (test)",
        flags=frozenset(),
        problems=(),
        missing_essential=(),
        devices=devices,
    )
