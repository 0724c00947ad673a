"""What a plugin reports about one cache it owns on disk (``werk_cache_inventory``).

A leaf module (it imports nothing from the plugin machinery) because :mod:`werk.hookspecs`
names :class:`CacheEntry` in a hook signature.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import msgspec

from .._paths import as_path

__all__ = ["ENTRY_ID_PATTERN", "CacheEntry"]

ENTRY_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
"""A plugin-local entry id: 1-128 letters, digits, ``.``, ``_``, ``:``, ``-`` (no ``/``)."""

_MAX_DESCRIPTION = 200


class CacheEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One plugin-owned cache on disk (for example an oMLX worker's cache directory).

    The host shows it as ``worker:<plugin>/<id>`` in ``werk cache list`` and asks the plugin
    itself to delete it (``werk_cache_purge``); the host never deletes ``path`` on its own.

    :ivar id: plugin-local id, unique among the plugin's entries (see
        :data:`ENTRY_ID_PATTERN`); stable across calls so an operator can name it later.
    :ivar path: where the cache lives (shown relative to ``WERK_HOME`` when inside it).
    :ivar model: the model id it belongs to, if any (``--model`` filters on it).
    :ivar bytes: its size on disk, if known.
    :ivar created_at: creation time, seconds since the epoch, if known.
    :ivar last_used_at: last use, seconds since the epoch, if known (``--older-than`` uses it,
        else ``created_at``).
    :ivar active: in use by a live process right now: every purge skips it.
    :ivar pinned: the operator asked to keep it: every purge skips it.
    :ivar description: one line for people (at most 200 characters).
    """

    id: str
    path: Path | None = None
    model: str | None = None
    bytes: int | None = None
    created_at: float | None = None
    last_used_at: float | None = None
    active: bool = False
    pinned: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        given: object = self.path  # typed Path | None; a plugin may pass a str
        if given is not None and not isinstance(given, Path):
            msgspec.structs.force_setattr(self, "path", as_path(given, "CacheEntry.path"))
        if not isinstance(self.id, str) or not ENTRY_ID_PATTERN.fullmatch(self.id):
            raise ValueError(
                f"cache entry id {self.id!r} does not match {ENTRY_ID_PATTERN.pattern}"
            )
        if self.bytes is not None and (isinstance(self.bytes, bool) or self.bytes < 0):
            raise ValueError("cache entry bytes must be a non-negative integer")
        for name in ("created_at", "last_used_at"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value < 0):
                raise ValueError(f"cache entry {name} must be a finite, non-negative timestamp")
        if self.model is not None and not 0 < len(self.model) <= 128:
            raise ValueError("cache entry model must be 1-128 characters")
        if len(self.description) > _MAX_DESCRIPTION or "\n" in self.description:
            raise ValueError(f"cache entry description must be one line of <= {_MAX_DESCRIPTION}")
