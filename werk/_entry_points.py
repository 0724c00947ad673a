"""Finding the ``werk`` entry points without importing ``importlib.metadata``.

``importlib.metadata`` costs 25-40 ms to import (it loads ``email``, ``zipfile`` and
``importlib.resources``) before it scans anything, and every ``werk`` command that loads the
plugins paid it. The installed distributions are directories on the import path, so this
module reads them the way ``importlib.metadata.entry_points()`` does (same order, same
first-wins rule for a distribution found twice, same ``entry_points.txt`` syntax) and parses only
the ``Name``/``Version`` headers of a distribution that declares a ``werk`` entry point.

Where the import path holds something other than directories (a zip archive) or an import hook
offers distributions of its own, :func:`entry_points` asks ``importlib.metadata`` instead.
``tests/test_entry_points.py`` compares both on real and crafted installations.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import sys
from collections.abc import Iterable, Sequence
from importlib.machinery import PathFinder
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import Distribution

__all__ = ["EntryPoint", "entry_points"]

_PATTERN = re.compile(r"(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?((?P<extras>\[.*\])\s*)?$")
"""``importlib.metadata.EntryPoint.pattern``."""


class EntryPoint:
    """One entry point: ``name = value`` in ``group`` of distribution ``dist_name``."""

    __slots__ = ("dist_name", "dist_version", "group", "name", "value")

    def __init__(
        self, name: str, value: str, group: str, dist_name: str | None, dist_version: str | None
    ) -> None:
        self.name = name
        self.value = value
        self.group = group
        self.dist_name = dist_name
        self.dist_version = dist_version

    def load(self) -> object:
        """Import the module and return the named attribute (``importlib.metadata``'s rule)."""
        match = _PATTERN.match(self.value)
        if match is None:
            raise ValueError(f"entry point {self.name!r} has an invalid value {self.value!r}")
        module = importlib.import_module(match.group("module"))
        attrs = filter(None, (match.group("attr") or "").split("."))
        return functools.reduce(getattr, attrs, module)

    def __repr__(self) -> str:
        return f"EntryPoint({self.name!r}, {self.value!r}, {self.group!r}, {self.dist_name!r})"


def entry_points(group: str, path: Sequence[str] | None = None) -> list[EntryPoint]:
    """The entry points of ``group`` of the distributions on ``path`` (default ``sys.path``)."""
    search = list(sys.path if path is None else path)
    if _needs_importlib(search):
        return _from_importlib(group, search)
    found: list[EntryPoint] = []
    seen: set[str] = set()
    for entry in search:
        root = entry or "."
        try:
            children = os.listdir(root)
        except OSError:
            continue
        for child in children:
            low = child.lower()
            if not low.endswith((".dist-info", ".egg-info")):
                continue
            normalized = _normalize(low.rpartition(".")[0].partition("-")[0])
            if normalized in seen:
                continue
            seen.add(normalized)
            found.extend(_declared(os.path.join(root, child), group))
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _needs_importlib(search: list[str]) -> bool:
    """An import hook offering distributions of its own, an archive or an ``.egg`` on the
    path: cases only ``importlib.metadata`` reads right."""
    for finder in sys.meta_path:
        if hasattr(finder, "find_distributions") and finder is not PathFinder:
            return True
    return any(e.lower().endswith(".egg") or os.path.isfile(e) for e in search if e)


def _declared(info: str, group: str) -> list[EntryPoint]:
    try:
        with open(os.path.join(info, "entry_points.txt"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    pairs = []
    section: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
            continue
        if section == group:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    if not pairs:
        return []
    dist_name, dist_version = _name_and_version(info)
    return [EntryPoint(name, value, group, dist_name, dist_version) for name, value in pairs]


def _name_and_version(info: str) -> tuple[str | None, str | None]:
    """The ``Name`` and ``Version`` headers of ``METADATA`` (or an egg's ``PKG-INFO``)."""
    for filename in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(info, filename), encoding="utf-8") as f:
                head = f.read(64 * 1024)
        except OSError:
            continue
        name = version = None
        for line in head.split("\n"):
            if not line.strip():
                break  # the headers end at the first empty line
            key, sep, value = line.partition(":")
            if not sep:
                continue
            if key == "Name" and name is None:
                name = value.strip()
            elif key == "Version" and version is None:
                version = value.strip()
        return name, version
    return None, None


def _from_importlib(group: str, search: list[str]) -> list[EntryPoint]:
    from importlib import metadata

    found = []
    for dist in _unique(metadata.distributions(path=search)):
        for ep in dist.entry_points.select(group=group):
            found.append(EntryPoint(ep.name, ep.value, group, dist.name, dist.version))
    return found


def _unique(dists: Iterable[Distribution]) -> list[Distribution]:
    """The first distribution of each normalised name (``importlib.metadata._unique``)."""
    seen: set[str] = set()
    unique = []
    for dist in dists:
        key = _normalize(dist.name or "")
        if key not in seen:
            seen.add(key)
            unique.append(dist)
    return unique
