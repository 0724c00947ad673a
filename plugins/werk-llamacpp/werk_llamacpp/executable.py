"""Locating the ``llama-server`` executable.

Search order (the first that is set wins; a set-but-broken explicit choice is reported, never
silently skipped in favour of a later one):

1. ``WERK_LLAMA_SERVER`` (environment): an explicit path for every model.
2. The model manifest option ``{"llama_server": PATH}``: a per-model configured path (for a
   model that needs a particular build).
3. ``llama-server`` on ``PATH``.
4. The build cache that ``scripts/build_llama_server.py`` (``make serve``/``make test``)
   fills: ``$WERK_BUILD_CACHE`` or the user cache dir (``~/.cache/werk``), then
   ``llama-server/<version>/bin/llama-server``; the numerically highest version wins
   (``11434.0.0`` beats ``9999.0.0``; ``b2000`` beats ``b1000``).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import platformdirs

__all__ = ["CACHE_ENV", "ENV", "OPTION", "Located", "cache_root", "locate_llama_server"]

ENV = "WERK_LLAMA_SERVER"
CACHE_ENV = "WERK_BUILD_CACHE"
OPTION = "llama_server"
"""The model manifest option naming a configured executable path."""


class Located(msgspec.Struct, frozen=True):
    path: Path | None
    reason: str


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def cache_root() -> Path:
    base = os.environ.get(CACHE_ENV)
    return Path(base) if base else Path(platformdirs.user_cache_dir("werk", appauthor=False))


def _version_key(version: str) -> tuple[tuple[int, ...], str]:
    """Numeric parts first (``11434.0.0`` > ``9999.0.0``), the text as the tie-break."""
    return tuple(int(n) for n in re.findall(r"\d+", version)), version


def _cache_candidates() -> list[Path]:
    builds = cache_root() / "llama-server"
    if not builds.is_dir():
        return []
    found = [p for p in builds.glob("*/bin/llama-server") if not p.parts[-3].startswith(".")]
    return sorted(found, key=lambda p: _version_key(p.parts[-3]), reverse=True)


def _explicit(raw: str, origin: str) -> Located:
    path = Path(raw).expanduser()
    if _is_executable(path):
        return Located(path.absolute(), f"from {origin}")
    return Located(None, f"{origin}={raw} is not an executable file")


def locate_llama_server(options: Mapping[str, Any] | None = None) -> Located:
    """Find ``llama-server``; ``options`` are the model manifest's options, if any."""
    explicit = os.environ.get(ENV)
    if explicit:
        return _explicit(explicit, ENV)
    configured = (options or {}).get(OPTION)
    if configured is not None:
        if not isinstance(configured, str) or not configured:
            return Located(None, f"model option {OPTION!r} must be a non-empty path string")
        return _explicit(configured, f"model option {OPTION}")
    found = shutil.which("llama-server")
    if found:
        return Located(Path(found).absolute(), "from PATH")
    for candidate in _cache_candidates():
        if _is_executable(candidate):
            return Located(candidate.absolute(), "from the werk build cache")
    return Located(
        None,
        f"set {ENV} to a llama-server executable, set the model option {OPTION!r}, or put "
        "llama-server on PATH (a Werk checkout builds one with `make llama-server`)",
    )
