"""The oMLX worker directories in ``werk cache`` (hooks ``werk_cache_inventory`` and
``werk_cache_purge``).

Each ``WERK_HOME/backends/omlx/workers/w_<16 hex>/`` is one entry (``worker:werk-omlx/w_…``):
its size is what the worker wrote there (the prefix cache, logs; the model link is not followed
and never counted), its model and start time come from ``worker.json``, its last use is the
newest modification under it. It is active while a worker holds ``worker.lock``; a purge takes
that lock itself, so a worker cannot start while its directory is being removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
from pathlib import Path

from werk import CacheEntry, Conflict

from .worker import workers_root

__all__ = ["inventory", "purge"]

_KEY = re.compile(r"^w_[0-9a-f]{16}$")
_MAX_ENTRIES = 100_000


def _walk(root: Path) -> tuple[int, float]:
    """Bytes of the regular files under ``root`` and the newest mtime (links not followed)."""
    total, newest, seen = 0, 0.0, 0
    for path, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > _MAX_ENTRIES:
                return total, newest
            try:
                st = os.lstat(os.path.join(path, name))
            except OSError:
                continue
            newest = max(newest, st.st_mtime)
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total, newest


def _held(base: Path) -> bool:
    try:
        fd = os.open(base / "worker.lock", os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _record(base: Path) -> dict[str, object]:
    try:
        data = json.loads((base / "worker.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _directories(home: Path) -> list[Path]:
    root = workers_root(home)
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for entry in sorted(root.iterdir()):
        if _KEY.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            found.append(entry)
    return found


def inventory(home: Path) -> list[CacheEntry]:
    entries = []
    for base in _directories(home):
        record = _record(base)
        size, newest = _walk(base)
        model = record.get("model")
        started = record.get("started_at")
        cache_on = record.get("prefix_cache") is True
        entries.append(
            CacheEntry(
                id=base.name,
                path=base,
                model=model if isinstance(model, str) and model else None,
                bytes=size,
                created_at=float(started) if isinstance(started, (int, float)) else None,
                last_used_at=newest or None,
                active=_held(base),
                description="oMLX worker directory"
                + (" with its native prefix cache (4 GB bound)" if cache_on else " (no cache)"),
            )
        )
    return entries


def purge(home: Path, entry_id: str) -> bool:
    """Remove one worker directory; ``Conflict`` while a worker holds it."""
    if not _KEY.fullmatch(entry_id):
        return False
    base = workers_root(home) / entry_id
    try:
        st = os.lstat(base)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    fd = os.open(base / "worker.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(f"oMLX worker {entry_id} is running") from None
        shutil.rmtree(base)  # symbolic links inside are removed, never followed
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return True
