"""Locating the ``llama-server`` executable.

Order: ``WERK_LLAMA_SERVER``; ``llama-server`` on ``PATH``; the build cache that the project's
setup produces (``$WERK_BUILD_CACHE`` or the user cache dir ``werk/llama-server/<version>/bin``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import platformdirs

ENV = "WERK_LLAMA_SERVER"
CACHE_ENV = "WERK_BUILD_CACHE"


@dataclass(frozen=True)
class Located:
    path: Path | None
    reason: str


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _cache_candidates() -> list[Path]:
    base = os.environ.get(CACHE_ENV)
    root = Path(base) if base else Path(platformdirs.user_cache_dir("werk", appauthor=False))
    builds = root / "llama-server"
    if not builds.is_dir():
        return []
    return sorted(builds.glob("*/bin/llama-server"), reverse=True)


def locate_llama_server() -> Located:
    explicit = os.environ.get(ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if _is_executable(path):
            return Located(path.absolute(), f"from {ENV}")
        return Located(None, f"{ENV}={explicit} is not an executable file")
    found = shutil.which("llama-server")
    if found:
        return Located(Path(found).absolute(), "from PATH")
    for candidate in _cache_candidates():
        if _is_executable(candidate):
            return Located(candidate.absolute(), "from the werk build cache")
    return Located(None, f"set {ENV}, put llama-server on PATH, or run `make serve` to build it")
