"""Wheels built once from a source distribution and kept in the user cache.

Some backends need a package the index offers only as source (``llama-cpp-python`` compiles
llama.cpp with CMake: minutes of CPU). A :class:`SourceWheel` names the distribution, its exact
version and the build settings (environment variables such as ``CMAKE_ARGS``); an
:class:`~werk.EnvironmentSpec` lists it in ``source_wheels`` and ``werk backends install`` builds
it before its ``pip install`` — or reuses the wheel an earlier install built::

    <cache>/wheels/<name>-<version>-<key>/   one finished build (key: version, settings, machine)
        <the wheel file>.whl
        build.json                          what was built, with which settings, how long it took
    <cache>/wheels/.building-*              a build in progress (removed when it ends or fails)

``<cache>`` is ``$WERK_BUILD_CACHE`` or the user cache directory (``~/.cache/werk``), the same
root as the llama-server build. **An interrupted build leaves no cache entry**: the wheel is
built in a private directory and published with one ``rename``; leftovers of a killed build are
removed by the next one. Builds of one entry are serialised with a lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
import platformdirs

from ._fs import fsync_dir, fsync_file
from .protocol import Unavailable

__all__ = ["SourceWheel", "build_source_wheel", "source_wheel_cache"]

CACHE_ENV = "WERK_BUILD_CACHE"
BUILD_TIMEOUT_SECONDS = 3 * 3600.0
_BUILDING = ".building-"
_PROGRESS = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]|\[\s*(\d+)%\]")
_LOG_TAIL = 40


class SourceWheel(msgspec.Struct, frozen=True, kw_only=True):
    """A distribution built from its source distribution on this machine.

    :ivar name: the distribution's name on the package index (``llama-cpp-python``).
    :ivar version: the exact version (the cache key; the index is never asked which is newest).
    :ivar environment: build settings passed to the build as environment variables
        (``{"CMAKE_ARGS": "-DGGML_NATIVE=OFF ..."}``); part of the cache key.
    """

    name: str
    version: str
    environment: Mapping[str, str] = msgspec.field(default_factory=dict)

    def key(self) -> str:
        """What decides the built wheel: name, version, settings and this machine's kind."""
        asked = {
            "name": self.name.lower(),
            "version": self.version,
            "environment": dict(sorted(self.environment.items())),
            "machine": platform.machine(),
            "system": sys.platform,
        }
        body = json.dumps(asked, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def source_wheel_cache() -> Path:
    """``$WERK_BUILD_CACHE/wheels`` or ``<user cache>/werk/wheels``."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base) if base else Path(platformdirs.user_cache_dir("werk", appauthor=False))
    return root.expanduser().absolute() / "wheels"


def _entry(wheel: SourceWheel) -> Path:
    slug = re.sub(r"[^a-z0-9.]+", "-", f"{wheel.name.lower()}-{wheel.version}")
    return source_wheel_cache() / f"{slug}-{wheel.key()}"


def cached_wheel(wheel: SourceWheel) -> Path | None:
    """The finished wheel file of ``wheel``'s cache entry, if one was published."""
    entry = _entry(wheel)
    if not (entry / "build.json").is_file():
        return None
    found = sorted(entry.glob("*.whl"))
    return found[0] if len(found) == 1 else None


def _remove_leftovers(root: Path) -> None:
    for leftover in root.glob(_BUILDING + "*"):
        if not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)


def build_source_wheel(
    wheel: SourceWheel,
    *,
    python: Path,
    report: Callable[[str], None] = lambda line: None,
    log_path: Path | None = None,
) -> Path:
    """The wheel file for ``wheel``: the cached one, or one built now with ``python -m pip
    wheel`` (``--no-deps --no-binary NAME``) and published into the cache.

    :param python: an interpreter with pip (the environment being built).
    :param report: called with each line of the build's progress (``[12/140] ...``) and its
        other output, for a display.
    :param log_path: where the build's whole output is appended (default: ``build.log`` in the
        private build directory, reported in the error).
    :raises werk.Unavailable: the build failed (the message names the log and its last lines).
    """
    found = cached_wheel(wheel)
    if found is not None:
        report(f"reusing {found.name} (built earlier, cache {found.parent.name})")
        return found
    root = source_wheel_cache()
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build of any source wheel: wait for it
        found = cached_wheel(wheel)
        if found is not None:
            report(f"reusing {found.name} (built while this one waited)")
            return found
        _remove_leftovers(root)
        building = root / (_BUILDING + secrets.token_hex(6))
        building.mkdir(mode=0o700)
        try:
            return _build(wheel, python, building, report, log_path)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    finally:
        os.close(lock)


def _build(
    wheel: SourceWheel,
    python: Path,
    building: Path,
    report: Callable[[str], None],
    log_path: Path | None,
) -> Path:
    out = building / "wheel"
    out.mkdir()
    log = log_path or building / "build.log"
    argv = [
        str(python), "-m", "pip", "wheel", "--no-deps", "--no-binary", wheel.name,
        "--progress-bar", "off", "-v", "-w", str(out), wheel.requirement(),
    ]  # fmt: skip
    env = {
        **os.environ,
        **wheel.environment,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "CMAKE_BUILD_PARALLEL_LEVEL": os.environ.get(
            "CMAKE_BUILD_PARALLEL_LEVEL", str(len(os.sched_getaffinity(0)) or 1)
        ),
    }
    started = time.monotonic()
    tail: list[str] = []
    report(f"building {wheel.requirement()} from source (takes minutes; log {log})")
    with log.open("a", encoding="utf-8") as sink:
        sink.write(f"$ {' '.join(argv)}\n")
        with subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sink.write(line)
                text = line.strip()
                tail = [*tail[-(_LOG_TAIL - 1) :], text]
                progress = _PROGRESS.search(text)
                if progress is not None:
                    report(progress.group(0) + " " + text[progress.end() :].strip()[:120])
                elif text.startswith(("Building wheel", "Created wheel", "Successfully")):
                    report(text[:200])
                if time.monotonic() - started > BUILD_TIMEOUT_SECONDS:
                    proc.kill()
                    break
            code = proc.wait()
    built = sorted(out.glob("*.whl"))
    if code != 0 or len(built) != 1:
        last = "\n".join(line for line in tail[-8:] if line)
        raise Unavailable(
            f"building {wheel.requirement()} from source failed (exit {code}); see {log}:\n{last}",
            retryable=False,
        )
    record = {
        "name": wheel.name,
        "version": wheel.version,
        "environment": dict(wheel.environment),
        "machine": platform.machine(),
        "wheel": built[0].name,
        "sha256": _sha256(built[0]),
        "seconds": round(time.monotonic() - started, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "build.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    for path in (built[0], out / "build.json"):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fsync_file(fd)
        finally:
            os.close(fd)
    entry = _entry(wheel)
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(entry)  # an entry without its record or wheel (never used)
    os.rename(out, entry)
    root = os.open(entry.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fsync_dir(root)
    finally:
        os.close(root)
    report(f"built {built[0].name} in {record['seconds']} s; cached in {entry}")
    return entry / built[0].name


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()
