"""The sorted state ids of a principal directory, kept between listings while it is unchanged.

A page of a listing reads the metadata of its own states only; what remains is listing the
directory (100,000 names: tens of milliseconds). The names are kept per principal together
with the directory's identity and modification time, and reused while both are unchanged:
every commit, deletion or quarantine renames an entry in or out of the directory, which moves
its modification time, whichever process did it. A directory modified within the last
:data:`SETTLE_SECONDS` is never kept: file system timestamps are coarse (a clock tick), and a
change in the same tick as the listing would leave the time as it was.
"""

from __future__ import annotations

import os
import threading
import time

from .layout import state_names

__all__ = ["SETTLE_SECONDS", "StateNames"]

SETTLE_SECONDS = 0.5


class StateNames:
    """Per-principal cache of :func:`werk.state.layout.state_names` (thread-safe)."""

    def __init__(self, max_principals: int = 64) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, tuple[tuple[int, int, int], list[str]]] = {}
        self._max = max_principals

    def get(self, principal: str, pdir_fd: int) -> list[str]:
        info = os.fstat(pdir_fd)
        identity = (info.st_dev, info.st_ino, info.st_mtime_ns)
        with self._lock:
            kept = self._kept.get(principal)
        if kept is not None and kept[0] == identity:
            return kept[1]
        names = state_names(pdir_fd)
        if time.time_ns() - info.st_mtime_ns > SETTLE_SECONDS * 1e9:
            with self._lock:
                if len(self._kept) >= self._max and principal not in self._kept:
                    self._kept.pop(next(iter(self._kept)))
                self._kept[principal] = (identity, names)
        return names
