"""A clean virtual environment holding only the ``werk`` and ``werk-llamacpp`` wheels.

The slow packaging tests (``test_wheels.py``, ``test_example_backend.py``) need what a user gets
from ``pip install werk werk-llamacpp``: real wheels built from this checkout, installed with pip
into a fresh ``python -m venv`` made from the base interpreter (no ``--system-site-packages``),
with the dependencies resolved from the package index (the pip cache makes that quick). Nothing
in it may see the repository: commands run from an empty temporary directory, with an
environment stripped of ``PYTHONPATH``, ``VIRTUAL_ENV``, ``WERK_*`` and the dev venv's ``bin``.

Building the environment takes a few seconds plus one pip install, so it is built once per test
session and shared: :func:`shared_clean_venv` memoises it per pytest base temp directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "LLAMACPP_DIR",
    "REPO_ROOT",
    "CleanVenv",
    "base_python",
    "build_wheel",
    "create_venv",
    "shared_clean_venv",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
LLAMACPP_DIR = REPO_ROOT / "plugins" / "werk-llamacpp"

BUILD_TIMEOUT_S = 300
PIP_TIMEOUT_S = 600
COMMAND_TIMEOUT_S = 120

_STRIPPED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV")


def base_python() -> Path:
    """The interpreter the dev venv was made from (never a venv's own ``python``)."""
    candidate = Path(getattr(sys, "_base_executable", "") or sys.executable)
    if (candidate.parent.parent / "pyvenv.cfg").exists():
        raise RuntimeError(f"{candidate} belongs to a virtual environment, not a base install")
    return candidate


def _clean_path(extra: Sequence[Path]) -> str:
    dev_bin = str(Path(sys.prefix) / "bin")
    kept = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p and p != dev_bin]
    kept = [p for p in kept if not Path(p).resolve().is_relative_to(REPO_ROOT)]
    return os.pathsep.join([*(str(e) for e in extra), *kept])


def clean_env(extra_path: Sequence[Path] = (), **overrides: str) -> dict[str, str]:
    """``os.environ`` without anything that could point an interpreter back at the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _STRIPPED and not k.startswith(("WERK_", "PYTEST_"))
    }
    env["PATH"] = _clean_path(extra_path)
    env["PYTHONNOUSERSITE"] = "1"
    env.update(overrides)
    return env


def _run(
    argv: Sequence[str | Path],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(str(a) for a in argv)} exited {proc.returncode}\n"
            f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
        )
    return proc


def build_wheel(project: Path, outdir: Path) -> Path:
    """``python -m build --wheel --no-isolation`` with the dev venv's build tools.

    :returns: the one wheel built into ``outdir`` (created empty here).
    """
    outdir.mkdir(parents=True)
    argv: list[str | Path] = [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
    argv += ["--outdir", outdir, project]
    _run(argv, cwd=outdir, env=clean_env(), timeout=BUILD_TIMEOUT_S)
    wheels = sorted(outdir.glob("*.whl"))
    assert len(wheels) == 1, f"expected one wheel from {project}, got {wheels}"
    return wheels[0]


@dataclass
class CleanVenv:
    """A venv with ``werk`` and ``werk-llamacpp`` installed from wheels, and how to use it.

    :ivar root: the venv directory.
    :ivar workdir: an empty directory outside the repository; every command runs there.
    :ivar home: ``WERK_HOME`` for commands run in the venv.
    :ivar wheels: the installed wheels by distribution name.
    :ivar timings: seconds spent per setup step (printed, never asserted).
    """

    root: Path
    workdir: Path
    home: Path
    wheels: dict[str, Path]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    def env(self) -> dict[str, str]:
        return clean_env([self.bin], WERK_HOME=str(self.home))

    def run(
        self, *argv: str | Path, check: bool = True, timeout: float = COMMAND_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` from :attr:`workdir` with the clean environment."""
        return _run(argv, cwd=self.workdir, env=self.env(), timeout=timeout, check=check)

    def pip(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return self.run(
            self.python,
            "-m",
            "pip",
            "--no-input",
            "--disable-pip-version-check",
            *args,
            timeout=PIP_TIMEOUT_S,
        )

    def werk_json(self, *args: str) -> Any:
        """``<venv>/bin/werk ARGS --json`` parsed; the command must succeed."""
        return json.loads(self.run(self.bin / "werk", *args, "--json").stdout)

    def python_json(self, source: str) -> Any:
        """Run ``source`` (written to a file in :attr:`workdir`) and parse its stdout as JSON."""
        script = self.workdir / "script.py"
        script.write_text(source, encoding="utf-8")
        try:
            return json.loads(self.run(self.python, script).stdout)
        finally:
            script.unlink()


def create_venv(base: Path, wheels: dict[str, Path]) -> CleanVenv:
    """A fresh venv under ``base`` with exactly ``wheels`` installed (dependencies resolved by
    pip, as for a user)."""
    workdir = base / "work"
    workdir.mkdir()
    home = base / "werk-home"
    venv = CleanVenv(root=base / "venv", workdir=workdir, home=home, wheels=wheels)
    started = time.perf_counter()
    _run([base_python(), "-m", "venv", venv.root], cwd=workdir, env=clean_env(), timeout=300)
    venv.timings["python -m venv"] = time.perf_counter() - started
    started = time.perf_counter()
    venv.pip("install", *wheels.values())
    venv.timings["pip install wheels + deps"] = time.perf_counter() - started
    return venv


def _create(base: Path) -> CleanVenv:
    started = time.perf_counter()
    wheels = {
        "werk": build_wheel(REPO_ROOT, base / "dist" / "werk"),
        "werk-llamacpp": build_wheel(LLAMACPP_DIR, base / "dist" / "werk-llamacpp"),
    }
    built = time.perf_counter() - started
    venv = create_venv(base, wheels)
    venv.timings = {"build wheels": built, **venv.timings}
    print(
        "clean venv setup: " + ", ".join(f"{k} {v:.1f}s" for k, v in venv.timings.items()),
        file=sys.stderr,
    )
    return venv


_SHARED: dict[Path, CleanVenv | BaseException] = {}


def shared_clean_venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    """The session's clean venv, built on first use (a failure is remembered, not retried)."""
    key = tmp_path_factory.getbasetemp()
    if key not in _SHARED:
        try:
            _SHARED[key] = _create(tmp_path_factory.mktemp("clean-venv", numbered=True))
        except BaseException as exc:
            _SHARED[key] = exc
            raise
    found = _SHARED[key]
    if isinstance(found, BaseException):
        raise AssertionError("building the shared clean venv failed earlier") from found
    return found
