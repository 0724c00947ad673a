"""Finding and inspecting the ``omlx`` CLI.

Werk starts an oMLX that is already installed (oMLX runs only on macOS on Apple silicon and is
not on PyPI): ``WERK_OMLX_BIN``, else ``omlx`` on ``PATH``. Each executable is inspected once
per identity (resolved path, size, mtime, inode): ``omlx --version`` (the CLI at jundot/omlx
commit 01496518 has none: the version is then ``unknown``) and ``omlx serve --help``, whose flags
must include every flag Werk generates, or nothing is spawned.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import anyio

from werk import CapabilityId, Unavailable

__all__ = [
    "BIN_ENV",
    "Inspection",
    "Installation",
    "inspect_omlx",
    "locate",
    "platform_note",
    "require_flags",
]

BIN_ENV = "WERK_OMLX_BIN"
INSPECT_TIMEOUT_SECONDS = 60.0
_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?(?:[a-z0-9.+-]*)?)")


@dataclass(frozen=True)
class Installation:
    """An ``omlx`` executable and where it was found."""

    path: Path
    source: str

    def identity(self) -> tuple[str, int, int, int]:
        st = self.path.stat()
        return (str(self.path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(frozen=True)
class Inspection:
    """What ``omlx --version`` and ``omlx serve --help`` said."""

    version: str
    flags: frozenset[str]


_INSPECTED: dict[tuple[str, int, int, int], Inspection] = {}


def platform_note() -> str:
    """Empty on macOS/arm64; else why the real oMLX cannot run here."""
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        return ""
    return f"oMLX needs macOS on Apple silicon; this is {platform.system()} {platform.machine()}"


def locate() -> Installation:
    """``WERK_OMLX_BIN``, else ``omlx`` on ``PATH``; ``Unavailable`` naming what is missing."""
    configured = os.environ.get(BIN_ENV)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise Unavailable(
                f"{BIN_ENV}={configured} is not an executable",
                capability=CapabilityId.MODEL_RESIDENCY,
                retryable=False,
            )
        return Installation(path, BIN_ENV)
    found = shutil.which("omlx")
    if found is None:
        note = platform_note()
        raise Unavailable(
            (f"{note}; " if note else "") + f"no `omlx` executable ({BIN_ENV} unset, none on PATH)",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    return Installation(Path(found), "PATH")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_SECONDS, check=False,
        env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _inspect(installation: Installation) -> Inspection:
    try:
        version = _run([str(installation.path), "--version"])
        helped = _run([str(installation.path), "serve", "--help"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(
            f"`{installation.path} serve --help` could not be run: {exc}",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        ) from None
    if helped.returncode != 0:
        raise Unavailable(
            f"`{installation.path} serve --help` exited {helped.returncode}: not an oMLX CLI",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    found = _VERSION.search(version.stdout) if version.returncode == 0 else None
    return Inspection(
        version=found.group(1) if found else "unknown",
        flags=frozenset(_FLAG.findall(helped.stdout)),
    )


async def inspect_omlx(installation: Installation) -> Inspection:
    """The executable's inspection, run once per identity (in a worker thread)."""
    key = installation.identity()
    cached = _INSPECTED.get(key)
    if cached is None:
        cached = await anyio.to_thread.run_sync(_inspect, installation)
        _INSPECTED[key] = cached
    return cached


def require_flags(inspection: Inspection, flags: list[str]) -> None:
    """``Unavailable`` naming the first generated flag ``serve --help`` does not list."""
    for flag in flags:
        if flag.startswith("--") and flag not in inspection.flags:
            raise Unavailable(
                f"this omlx ({inspection.version}) does not offer {flag} in `serve --help`; "
                "Werk needs it",
                capability=CapabilityId.MODEL_RESIDENCY,
                retryable=False,
            )
