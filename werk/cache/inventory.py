"""The inventory behind ``werk cache list``: four categories, one list, stable ids.

* ``chat`` — sessions under ``chat-sessions/``: ``chat:<name>`` is the message archive (the
  whole session directory; a *conversation*, kept by bulk purges unless included) and
  ``chat:<name>/native`` the backend-native KV snapshot data beside it, when there is any.
* ``worker`` — caches plugins own, reported through ``werk_cache_inventory``:
  ``worker:<plugin>/<id>``.
* ``state`` — managed disk states under ``runtime-state/v1/``, read through
  :class:`~werk.state.catalog.StateCatalog` for every principal directory (principals are
  opaque; the local operator sees all of them): ``state:<principal dir>/<state id>``.
* ``job`` — durable media job records under ``jobs/`` with their outputs (every principal's):
  ``job:<job id>``; an unfinished job is ``active`` (its server's runner writes it).

Listing is read-only: it creates, repairs and deletes nothing, and takes no lock. ``active``
means a live process holds the entry now (a chat session's ``flock``, or what a plugin says);
``pinned`` means the operator asked to keep it. Model weights are never part of the inventory.
"""

from __future__ import annotations

import contextlib
import enum
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _fs
from .._fs import Rejected
from ..plugins import WerkPluginManager
from ..protocol import NotFound, WerkError, rfc3339
from ..state.catalog import StateCatalog
from ..state.layout import STORE_DIRS, open_store_root
from ..state.metadata import principal_from_dir_name
from .entry import CacheEntry

__all__ = ["CacheItem", "CacheKind", "Filters", "collect", "select"]

_MAX_DEPTH = 16
_MAX_ENTRIES = 100_000


class CacheKind(enum.StrEnum):
    CHAT = "chat"
    WORKER = "worker"
    STATE = "state"
    JOB = "job"


@dataclass(frozen=True, kw_only=True)
class CacheItem:
    """One row of the inventory.

    :ivar id: the stable cache id (``chat:…``, ``worker:…``, ``state:…``).
    :ivar kind: the category.
    :ivar location: where it lives, relative to ``WERK_HOME`` when inside it.
    :ivar model: the model id, if known.
    :ivar bytes: size on disk, if known.
    :ivar created_at: seconds since the epoch, if known.
    :ivar last_used_at: seconds since the epoch, if known.
    :ivar active: who holds it now (``"pid 123"``, ``"a live process"``), or ``None``.
    :ivar pinned: kept on purpose.
    :ivar conversation: a conversation archive (bulk purges keep it unless included).
    :ivar description: one line.
    :ivar target: what purging acts on (category-specific; not shown).
    """

    id: str
    kind: CacheKind
    location: str
    model: str | None = None
    bytes: int | None = None
    created_at: float | None = None
    last_used_at: float | None = None
    active: str | None = None
    pinned: bool = False
    conversation: bool = False
    description: str = ""
    target: tuple[str, ...] = ()

    def age(self, now: float) -> float | None:
        """Seconds since last use (else since creation); ``None`` when neither is known."""
        reference = self.last_used_at if self.last_used_at is not None else self.created_at
        return None if reference is None else now - reference

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind.value,
            "location": self.location,
            "model": self.model,
            "bytes": self.bytes,
            "created_at": None if self.created_at is None else rfc3339(self.created_at),
            "last_used_at": None if self.last_used_at is None else rfc3339(self.last_used_at),
            "active": self.active is not None,
            "holder": self.active,
            "pinned": self.pinned,
            "conversation": self.conversation,
            "description": self.description,
        }


@dataclass(frozen=True, kw_only=True)
class Filters:
    """``--kind``, ``--model`` and ``--older-than`` (seconds)."""

    kind: CacheKind | None = None
    model: str | None = None
    older_than: int | None = None

    def match(self, item: CacheItem, now: float) -> bool:
        if self.kind is not None and item.kind is not self.kind:
            return False
        if self.model is not None and item.model != self.model:
            return False
        if self.older_than is not None:
            age = item.age(now)
            if age is None or age < self.older_than:
                return False
        return True


def select(items: list[CacheItem], filters: Filters, now: float | None = None) -> list[CacheItem]:
    moment = time.time() if now is None else now
    return [item for item in items if filters.match(item, moment)]


def collect(
    home: Path,
    pm: WerkPluginManager,
    *,
    warn: Callable[[str], None],
    kinds: frozenset[CacheKind] = frozenset(CacheKind),
) -> list[CacheItem]:
    """Every cache entry of ``home`` in the categories ``kinds`` (chat, worker, state, job
    order)."""
    items: list[CacheItem] = []
    if CacheKind.CHAT in kinds:
        items += chat_items(home)
    if CacheKind.WORKER in kinds:
        items += worker_items(home, pm, warn)
    if CacheKind.STATE in kinds:
        items += state_items(home)
    if CacheKind.JOB in kinds:
        items += job_items(home)
    return items


# -- durable jobs ------------------------------------------------------------------------------


def job_items(home: Path) -> list[CacheItem]:
    from ..protocol import TERMINAL_JOB_STATUSES
    from ..state.jobs import JobStore

    items = []
    for _, record in JobStore(home, clock=time.time).every_record():
        model = record.request.get("model") if isinstance(record.request, dict) else None
        output = record.output
        described = f"{record.kind} job, {record.status}"
        if output is not None:
            described += f", output {output.content_type}"
        items.append(
            CacheItem(
                id=f"job:{record.id}",
                kind=CacheKind.JOB,
                location=f"jobs/{record.id}.json",
                model=model if isinstance(model, str) else None,
                bytes=_record_bytes(home, record.id) + (output.bytes if output else 0),
                created_at=_epoch(record.created_at),
                last_used_at=_epoch(record.updated_at),
                active=None if record.status in TERMINAL_JOB_STATUSES else "an unfinished job",
                description=described,
                target=(record.id,),
            )
        )
    return items


def _record_bytes(home: Path, job_id: str) -> int:
    """The record file's size (its output's size is in the record)."""
    try:
        return os.lstat(home / "jobs" / f"{job_id}.json").st_size
    except OSError:
        return 0


def _epoch(stamp: str) -> float | None:
    from datetime import datetime

    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# -- chat sessions -----------------------------------------------------------------------------


def chat_items(home: Path) -> list[CacheItem]:
    from ..chat.archive import NATIVE_DIR, SESSIONS_DIR, SessionStore

    store = SessionStore(home)
    items: list[CacheItem] = []
    for name in store.names():
        location = f"{SESSIONS_DIR}/{name}"
        with _session_dir(store.root, name) as sfd:
            if sfd is None:
                items.append(
                    CacheItem(
                        id=f"chat:{name}",
                        kind=CacheKind.CHAT,
                        location=location,
                        description="unsafe entry (a link or not a private directory)",
                        target=(name, "session"),
                    )
                )
                continue
            archive_bytes = _tree_bytes(sfd, skip=NATIVE_DIR)
            native_bytes = _native_bytes(sfd, NATIVE_DIR)
            mtime = os.fstat(sfd).st_mtime
        holder = store.holder(name)
        model: str | None = None
        created: float | None = None
        used: float | None = mtime
        conversation = True
        try:
            record = store.read(name)
            model, created, used = record.model, record.created_at, record.updated_at
            description = f"conversation archive, {len(record.messages)} message(s)"
        except NotFound:
            conversation, description = False, "empty session (no archive)"
        except WerkError as exc:
            description = f"unreadable archive: {exc.message}"[:200]
        items.append(
            CacheItem(
                id=f"chat:{name}",
                kind=CacheKind.CHAT,
                location=location,
                model=model,
                bytes=archive_bytes + (native_bytes or 0),
                created_at=created,
                last_used_at=used,
                active=holder,
                conversation=conversation,
                description=description,
                target=(name, "session"),
            )
        )
        if native_bytes is not None:
            items.append(
                CacheItem(
                    id=f"chat:{name}/{NATIVE_DIR}",
                    kind=CacheKind.CHAT,
                    location=f"{location}/{NATIVE_DIR}",
                    model=model,
                    bytes=native_bytes,
                    created_at=created,
                    last_used_at=used,
                    active=holder,
                    description="native KV snapshot data of the session",
                    target=(name, NATIVE_DIR),
                )
            )
    return items


@contextlib.contextmanager
def _session_dir(root: Path, name: str) -> Iterator[int | None]:
    """The session directory, read-only; ``None`` when it is a link, not a directory, or not
    private (listed as unsafe)."""
    try:
        rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        sfd = _fs.open_dir(name, rfd)
    except (Rejected, OSError):
        sfd = -1
    finally:
        os.close(rfd)
    if sfd >= 0:
        try:
            _fs.check_private_dir(sfd, name)
        except Rejected:
            os.close(sfd)
            sfd = -1
    if sfd < 0:
        yield None
        return
    try:
        yield sfd
    finally:
        os.close(sfd)


def _native_bytes(sfd: int, name: str) -> int | None:
    try:
        fd = _fs.open_dir(name, sfd)
    except (FileNotFoundError, Rejected):
        return None
    try:
        return _tree_bytes(fd)
    finally:
        os.close(fd)


def _tree_bytes(dir_fd: int, *, skip: str | None = None, depth: int = 0) -> int:
    """Bytes of the regular files below ``dir_fd`` (links are counted as links, not followed)."""
    total = 0
    seen = 0
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            seen += 1
            if seen > _MAX_ENTRIES or entry.name == skip:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and depth < _MAX_DEPTH:
                try:
                    child = _fs.open_dir(entry.name, dir_fd)
                except (Rejected, OSError):
                    continue
                try:
                    total += _tree_bytes(child, depth=depth + 1)
                finally:
                    os.close(child)
            elif stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


# -- plugin-owned worker caches ----------------------------------------------------------------


def _relative(home: Path, path: Path | None) -> str:
    if path is None:
        return "-"
    with contextlib.suppress(ValueError):
        return str(Path(path).relative_to(home))
    return str(path)


def worker_items(home: Path, pm: WerkPluginManager, warn: Callable[[str], None]) -> list[CacheItem]:
    items: list[CacheItem] = []
    for plugin, implementer in pm.implementers("werk_cache_inventory"):
        try:
            results: list[Any] = pm.call_plugin(implementer, "werk_cache_inventory", home=home)
            result: Any = results[0] if results else None
            if result is not None and not isinstance(result, list | tuple):
                raise TypeError(f"returned {type(result).__name__}, not a list of entries")
            entries: list[object] = list(result or ())
            for entry in entries:
                if not isinstance(entry, CacheEntry):
                    raise TypeError(f"returned {type(entry).__name__}, not a werk.CacheEntry")
            ids = [e.id for e in entries if isinstance(e, CacheEntry)]
            if len(set(ids)) != len(ids):
                raise ValueError("returned duplicate entry ids")
        except Exception as exc:
            warn(f"plugin {plugin} failed to list its caches ({type(exc).__name__}: {exc})")
            continue
        for entry in entries:
            assert isinstance(entry, CacheEntry)
            items.append(
                CacheItem(
                    id=f"worker:{plugin}/{entry.id}",
                    kind=CacheKind.WORKER,
                    location=_relative(home, entry.path),
                    model=entry.model,
                    bytes=entry.bytes,
                    created_at=entry.created_at,
                    last_used_at=entry.last_used_at,
                    active="a live process" if entry.active else None,
                    pinned=entry.pinned,
                    description=entry.description,
                    target=(plugin, entry.id),
                )
            )
    return items


# -- managed disk states -----------------------------------------------------------------------


def principal_dirs(home: Path) -> list[tuple[str, str]]:
    """``(directory name, principal)`` of every principal directory in the store (read-only)."""
    root = open_store_root(home)
    if root is None:
        return []
    try:
        names = sorted(os.listdir(root))
    finally:
        os.close(root)
    out = []
    for name in names:
        principal = principal_from_dir_name(name)
        if principal is not None:
            out.append((name, principal))
    return out


def state_items(home: Path) -> list[CacheItem]:
    catalog = StateCatalog(home)
    items: list[CacheItem] = []
    base = "/".join(STORE_DIRS)
    for dirname, principal in principal_dirs(home):
        for state in catalog.list(principal):
            expiry = "" if state.expires_at is None else f", expires {rfc3339(state.expires_at)}"
            items.append(
                CacheItem(
                    id=f"state:{dirname}/{state.id}",
                    kind=CacheKind.STATE,
                    location=f"{base}/{dirname}/{state.id}",
                    model=state.model,
                    bytes=state.payload_bytes,
                    created_at=state.created_at,
                    last_used_at=state.last_accessed_at,
                    pinned=state.pinned,
                    description=f"{state.tier} state of backend {state.backend}{expiry}",
                    target=(principal, state.id),
                )
            )
    return items
