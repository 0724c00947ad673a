"""Helpers for the chat and cache tests: the real ``werk`` console script in subprocesses.

Two test plugins are installed with pip into one private ``--target`` directory that only the
``werk`` subprocesses see (``PYTHONPATH``), so they are discovered through their real entry
points while the dev virtual environment stays untouched:

* ``werk-test-backend`` (``tests/test_backend``, backend ``testkv``): deterministic replies that
  depend on every prompt token, so a conversation's history changes the answer;
* ``werk-standin`` (``tests/chat/standin_backend``, backend ``standin``): a runtime that owns a
  real ``sleep`` child process (standing for llama-server) and plugin-owned worker caches
  (standing for oMLX workers).
"""

from __future__ import annotations

import hashlib
import os
import select
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

import pytest

from werk.testing.terminal import HANG_GUARD, PtyChat

__all__ = [
    "HANG_GUARD",
    "PLUGINS",
    "PtyChat",
    "cli_env",
    "import_model",
    "install_plugins",
    "marker",
    "ok",
    "process_gone",
    "read_until",
    "tree_digest",
    "werk",
]

REPO = Path(__file__).resolve().parents[2]
WERK = Path(sys.executable).parent / "werk"
PLUGINS = "werk-test-backend,werk-standin"


def install_plugins(target: Path) -> Path:
    """``pip install --target`` both test plugins; returns the site directory."""
    site = target / "site"
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
            str(REPO / "tests" / "chat" / "standin_backend"),
        ],
        check=True,
        cwd=target,
    )
    return site


def cli_env(home: Path, site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTEST_"))}
    env.update(WERK_HOME=str(home), PYTHONPATH=str(site), WERK_LOAD_PLUGINS=PLUGINS)
    env.update(extra)
    return env


def werk(
    home: Path, site: Path, *args: str, stdin: str | None = None, **extra: str
) -> subprocess.CompletedProcess[str]:
    """Run ``werk ARGS`` to completion (stdin closed unless given)."""
    return subprocess.run(
        [str(WERK), *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=cli_env(home, site, **extra),
        timeout=HANG_GUARD,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def import_model(home: Path, site: Path, model_id: str, backend: str, text: str) -> Path:
    """Write a model file next to ``home`` and import it with the real CLI."""
    model_file = home.parent / f"{model_id}.{backend}"
    model_file.write_text(text)
    ok(
        werk(
            home, site, "models", "import", str(model_file), "--id", model_id, "--backend", backend
        )
    )
    return model_file


def marker(model_file: Path, suffix: str) -> Path:
    return model_file.with_name(model_file.name + suffix)


def process_gone(pid: int) -> bool:
    """Whether ``pid`` no longer exists at all (reaped: not even a zombie is left)."""
    return not Path(f"/proc/{pid}").exists()


def read_until(fd: int, needle: bytes, seen: bytearray, proc: subprocess.Popen[bytes]) -> None:
    """Read ``fd`` into ``seen`` until ``needle`` is in it; fail if the process ends first."""
    guard = time.monotonic() + HANG_GUARD
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            if not data:
                pytest.fail(f"output ended before {needle!r}:\n{seen.decode(errors='replace')}")
            seen += data
        elif proc.poll() is not None:
            pytest.fail(f"exit {proc.returncode} before {needle!r}:\n{seen.decode()}")
        if time.monotonic() > guard:
            proc.kill()
            pytest.fail(f"no {needle!r} in time:\n{seen.decode(errors='replace')}")


def tree_digest(root: Path, exclude: Collection[Path] = ()) -> dict[str, str]:
    """Relative path -> digest of every entry below ``root`` (files by content, links by
    target, directories by mode), leaving out ``exclude`` and everything under it."""
    excluded = {os.path.abspath(p) for p in exclude}
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if os.path.abspath(here / d) not in excluded]
        for name in [*dirnames, *filenames]:
            path = here / name
            if os.path.abspath(path) in excluded:
                continue
            rel = str(path.relative_to(root))
            st = path.lstat()
            if path.is_symlink():
                out[rel] = "link:" + os.readlink(path)
            elif path.is_dir():
                out[rel] = f"dir:{st.st_mode:o}"
            else:
                out[rel] = f"file:{st.st_mode:o}:" + hashlib.sha256(path.read_bytes()).hexdigest()
    return out
