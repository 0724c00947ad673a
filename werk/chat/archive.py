"""The backend-independent conversation archive under ``WERK_HOME/chat-sessions/``.

::

    WERK_HOME/chat-sessions/
    └── <name>/                 one session (0700); <name> is validated, never a path
        ├── messages.json       ArchiveRecord (strict JSON, 0600, replaced atomically)
        ├── session.lock        flock held by the live chat or run using the session (0600)
        └── native/             reserved for backend-native KV snapshot data (0700); the
                                archive never reads it, ``werk cache`` lists it separately

A session is text only: the model id it belongs to, an optional system prompt and the
user/assistant messages of completed turns. It survives restarts and can be resumed with any
runtime of the same model (a new local process, or a running ``werk serve``), because the whole
history is sent again with the next turn. Resuming it never implies that native KV tensors were
restored; that is the business of a native snapshot provider (see :mod:`werk.chat.native`).

Safety rules (shared with the state catalog through :mod:`werk.state._fs`): every entry below
``WERK_HOME`` is reached relative to an open directory descriptor with ``O_NOFOLLOW`` and checked
with ``fstat`` (owner, type, exact mode, link count); ``messages.json`` is written to a
temporary file, fsynced, renamed over the old one and the directory fsynced; sizes are bounded
(:data:`MAX_ARCHIVE_BYTES`, :data:`MAX_MESSAGES`). Anything that does not match is refused with
:class:`ArchiveError` instead of being followed or repaired.

Locking: the process using a session holds an exclusive, non-blocking ``flock`` on
``session.lock`` for its whole lifetime (a second user gets :class:`werk.Conflict`). Removal
takes the same lock, so a session in use by a live process is never deleted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from .. import _fs
from .._fs import Rejected
from ..protocol import (
    Conflict,
    InternalError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    WerkError,
    storage_refusal,
)

__all__ = [
    "LOCK",
    "MAX_ARCHIVE_BYTES",
    "MAX_MESSAGES",
    "MESSAGES",
    "NATIVE_DIR",
    "SESSIONS_DIR",
    "ArchiveError",
    "ArchiveRecord",
    "ChatArchive",
    "Message",
    "SessionStore",
    "validate_session_name",
]

SESSIONS_DIR = "chat-sessions"
MESSAGES = "messages.json"
LOCK = "session.lock"
NATIVE_DIR = "native"
"""The per-session directory reserved for backend-native KV snapshot files."""

TRASH_PREFIX = ".trash-"
MAX_ARCHIVE_BYTES = 32 * 1024 * 1024
MAX_MESSAGES = 10_000
MAX_LOCK_BYTES = 64
SCHEMA: Literal[1] = 1

SESSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PROBE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_HOME_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class ArchiveError(InternalError):
    """A chat session archive is unsafe, corrupt, or could not be written."""


class Message(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of a completed turn."""

    role: Literal["user", "assistant"]
    content: str


class ArchiveRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The content of ``messages.json`` (schema 1)."""

    schema: Literal[1]
    name: Annotated[str, msgspec.Meta(pattern=SESSION_NAME.pattern)]
    model: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    created_at: Annotated[float, msgspec.Meta(ge=0)]
    updated_at: Annotated[float, msgspec.Meta(ge=0)]
    system: str | None = None
    messages: Annotated[list[Message], msgspec.Meta(max_length=MAX_MESSAGES)] = []


_decoder = msgspec.json.Decoder(ArchiveRecord)


def validate_session_name(name: str) -> str:
    """A session name is 1-128 letters, digits, ``.``, ``_``, ``-``, not starting with a dot.

    :raises werk.InvalidRequest: anything else (a path, ``..``, an empty string).
    """
    if not SESSION_NAME.fullmatch(name) or ".." in name:
        raise InvalidRequest(
            f"session name {name!r} must be 1-128 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)"
        )
    return name


def decode_record(data: bytes, name: str) -> ArchiveRecord:
    """Decode ``messages.json``; :class:`ArchiveError` when malformed or of another session."""
    try:
        record = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ArchiveError(f"chat session {name!r}: corrupt archive ({exc})") from None
    if record.name != name:
        raise ArchiveError(f"chat session {name!r}: the archive names another session")
    return record


def _fail(name: str, exc: Rejected | OSError) -> WerkError:
    if isinstance(exc, OSError):
        refusal = storage_refusal(exc, f"write chat session {name!r}")
        if refusal is not None:
            return refusal
    reason = exc.reason if isinstance(exc, Rejected) else (exc.strerror or str(exc))
    return ArchiveError(f"chat session {name!r}: {reason}")


class SessionStore:
    """The ``chat-sessions`` directory of one ``WERK_HOME``.

    Reads (:meth:`names`, :meth:`read`, :meth:`holder`) create nothing and take no lock.
    """

    def __init__(self, home: Path) -> None:
        self.home = Path(home)

    @property
    def root(self) -> Path:
        return self.home / SESSIONS_DIR

    # -- reads -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _read_root(self) -> Iterator[int | None]:
        """The ``chat-sessions`` directory, read-only; ``None`` when missing (never created)."""
        try:
            home = os.open(self.home, _HOME_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            yield None
            return
        try:
            try:
                fd = _fs.open_dir(SESSIONS_DIR, home)
            except FileNotFoundError:
                yield None
                return
            except Rejected as exc:
                raise _fail(SESSIONS_DIR, exc) from None
        finally:
            os.close(home)
        try:
            try:
                _fs.check_private_dir(fd, SESSIONS_DIR)
            except Rejected as exc:
                raise _fail(SESSIONS_DIR, exc) from None
            yield fd
        finally:
            os.close(fd)

    def names(self) -> list[str]:
        """Every entry of ``chat-sessions`` whose name is a valid session name, sorted."""
        with self._read_root() as root:
            if root is None:
                return []
            entries = os.listdir(root)
        return sorted(n for n in entries if SESSION_NAME.fullmatch(n) and ".." not in n)

    def read(self, name: str) -> ArchiveRecord:
        """The archive of ``name`` (read-only, no lock).

        :raises werk.NotFound: no such session.
        :raises ArchiveError: the session exists but is unsafe or corrupt.
        """
        validate_session_name(name)
        with self._read_root() as root:
            if root is None:
                raise NotFound(f"no chat session {name!r}")
            try:
                sfd = _fs.open_dir(name, root)
            except FileNotFoundError:
                raise NotFound(f"no chat session {name!r}") from None
            except (Rejected, OSError) as exc:
                raise _fail(name, exc) from None
            try:
                return _read_record(sfd, name)
            finally:
                os.close(sfd)

    def holder(self, name: str) -> str | None:
        """Who holds ``name``'s lock (``"pid 1234"``, or ``"a live process"`` when no pid is
        readable), ``None`` when nobody does. Never creates the lock file."""
        validate_session_name(name)
        with self._read_root() as root:
            if root is None:
                return None
            try:
                sfd = _fs.open_dir(name, root)
            except (FileNotFoundError, Rejected):
                return None
            try:
                try:
                    fd = os.open(LOCK, _PROBE_FLAGS, dir_fd=sfd)
                except OSError:
                    return None
                try:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        pid = _lock_pid(fd)
                        return f"pid {pid}" if pid else "a live process"
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return None
                finally:
                    os.close(fd)
            finally:
                os.close(sfd)

    # -- the session directory -----------------------------------------------------------------

    def _ensure_root(self) -> int:
        """Open ``chat-sessions`` for a mutation, creating it (0700) when missing."""
        created = not self.home.exists()
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        home = os.open(self.home, _HOME_FLAGS)
        try:
            if created:
                os.fchmod(home, 0o700)
            return _ensure_private_dir(home, SESSIONS_DIR, SESSIONS_DIR)
        finally:
            os.close(home)

    def open(self, name: str, *, model: str, system: str | None = None) -> ChatArchive:
        """Lock the session ``name`` (creating it for ``model`` when new) and return it.

        :raises werk.Conflict: another live process holds the session, or it belongs to
            another model.
        :raises ArchiveError: unsafe or corrupt files.
        """
        validate_session_name(name)
        try:
            root = self._ensure_root()
        except OSError as exc:
            raise _fail(SESSIONS_DIR, exc) from None
        try:
            for _ in range(3):  # a concurrent purge may rename the directory away once
                sfd = _ensure_private_dir(root, name, name)
                try:
                    lock = _acquire_lock(sfd, name)
                except BaseException:
                    os.close(sfd)
                    raise
                if _same_entry(root, name, sfd):
                    break
                os.close(lock)
                os.close(sfd)
            else:
                raise ArchiveError(f"chat session {name!r} keeps being replaced; try again")
            try:
                archive = ChatArchive._open_locked(self, name, sfd, lock, model, system)
            except BaseException:
                os.close(lock)
                os.close(sfd)
                raise
            return archive
        except OSError as exc:
            raise _fail(name, exc) from None
        finally:
            os.close(root)

    # -- removal -----------------------------------------------------------------------------

    def remove(self, name: str, *, only_native: bool = False) -> bool:
        """Delete session ``name`` (or only its ``native/`` directory) under its lock.

        The directory is first renamed to a ``.trash-`` name (one atomic step, fsynced), then
        deleted without following links.

        :returns: ``False`` when there was nothing to delete.
        :raises werk.Conflict: a live process holds the session.
        """
        validate_session_name(name)
        try:
            return self._remove(name, only_native)
        except (Rejected, OSError) as exc:
            raise _fail(name, exc) from None

    def _remove(self, name: str, only_native: bool) -> bool:
        with self._read_root() as root:
            if root is None:
                return False
            try:
                st = _fs.lstat_at(name, root)
            except FileNotFoundError:
                return False
            if not stat.S_ISDIR(st.st_mode):  # a planted link or file: remove the entry itself
                if only_native:
                    return False
                _fs.remove_entry(root, name)
                _fs.fsync_dir(root)
                return True
            sfd = _fs.open_dir(name, root)
            try:
                lock = _acquire_lock(sfd, name, record_pid=False)
                try:
                    if only_native:
                        return _trash(sfd, NATIVE_DIR)
                    return _trash(root, name)
                finally:
                    os.close(lock)
            finally:
                os.close(sfd)


class ChatArchive:
    """One locked session: its record, and atomic saves. Close it to release the lock."""

    def __init__(
        self, store: SessionStore, name: str, dir_fd: int, lock_fd: int, record: ArchiveRecord
    ) -> None:
        self.store = store
        self.name = name
        self._dir = dir_fd
        self._lock = lock_fd
        self.record = record
        self.resumed = False
        self.system_replaced = False

    @classmethod
    def _open_locked(
        cls,
        store: SessionStore,
        name: str,
        sfd: int,
        lock: int,
        model: str,
        system: str | None,
    ) -> ChatArchive:
        _check_private(sfd, name)
        _remove_leftovers(sfd)
        try:
            record: ArchiveRecord | None = _read_record(sfd, name)
        except NotFound:
            record = None
        now = time.time()
        if record is None:
            fresh = ArchiveRecord(
                schema=SCHEMA, name=name, model=model, created_at=now, updated_at=now, system=system
            )
            archive = cls(store, name, sfd, lock, fresh)
            archive._write(fresh)
            return archive
        if record.model != model:
            raise Conflict(
                f"chat session {name!r} belongs to model {record.model!r}, not {model!r}; "
                "choose another --session name"
            )
        archive = cls(store, name, sfd, lock, record)
        archive.resumed = True
        if system is not None and system != record.system:
            archive.system_replaced = True
            archive.record = msgspec.structs.replace(record, system=system)
        return archive

    @property
    def path(self) -> Path:
        """The session directory (for display and for native snapshot providers)."""
        return self.store.root / self.name

    @property
    def messages(self) -> list[Message]:
        return list(self.record.messages)

    def save(self, messages: Sequence[Message], *, system: str | None) -> None:
        """Replace the archived history with ``messages`` (atomically, fsynced).

        :raises werk.PayloadTooLarge: over :data:`MAX_MESSAGES` or :data:`MAX_ARCHIVE_BYTES`;
            the previous archive stays as it was.
        """
        if len(messages) > MAX_MESSAGES:
            raise PayloadTooLarge(
                f"chat session {self.name!r} would hold more than {MAX_MESSAGES} messages; "
                "start a new session or /reset"
            )
        record = msgspec.structs.replace(
            self.record, messages=list(messages), system=system, updated_at=time.time()
        )
        self._write(record)
        self.record = record

    def _write(self, record: ArchiveRecord) -> None:
        data = msgspec.json.encode(record)
        if len(data) > MAX_ARCHIVE_BYTES:
            raise PayloadTooLarge(
                f"chat session {self.name!r} would exceed {MAX_ARCHIVE_BYTES // 2**20} MiB; "
                "start a new session or /reset"
            )
        try:
            _fs.replace_private_file(self._dir, MESSAGES, data)
        except OSError as exc:
            raise _fail(self.name, exc) from None

    def native_dir(self, *, create: bool) -> Path | None:
        """The session's private ``native/`` directory (checked 0700, never a link).

        :returns: its path, or ``None`` when it does not exist and ``create`` is false.
        """
        try:
            if create:
                fd = _ensure_private_dir(self._dir, NATIVE_DIR, f"{self.name}/{NATIVE_DIR}")
            else:
                try:
                    fd = _fs.open_dir(NATIVE_DIR, self._dir)
                except FileNotFoundError:
                    return None
                _check_private(fd, f"{self.name}/{NATIVE_DIR}")
            os.close(fd)
        except (Rejected, OSError) as exc:
            raise _fail(self.name, exc) from None
        return self.path / NATIVE_DIR

    def close(self) -> None:
        """Release the lock (idempotent)."""
        for attr in ("_lock", "_dir"):
            fd = getattr(self, attr)
            if fd >= 0:
                os.close(fd)
                setattr(self, attr, -1)

    def __enter__(self) -> ChatArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- helpers ---------------------------------------------------------------------------------


def _check_private(fd: int, what: str) -> None:
    try:
        _fs.check_private_dir(fd, what)
    except Rejected as exc:
        raise _fail(what, exc) from None


def _ensure_private_dir(parent: int, name: str, what: str) -> int:
    """Open the private directory ``name`` in ``parent``, creating it (0700) when missing."""
    try:
        fd = _fs.open_dir(name, parent)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):
            _fs.make_private_dir(parent, name)
            _fs.fsync_dir(parent)
        try:
            fd = _fs.open_dir(name, parent)
        except Rejected as exc:
            raise _fail(what, exc) from None
    except Rejected as exc:
        raise _fail(what, exc) from None
    try:
        _check_private(fd, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_record(sfd: int, name: str) -> ArchiveRecord:
    _check_private(sfd, name)
    try:
        data = _fs.read_small(MESSAGES, sfd, MAX_ARCHIVE_BYTES)
    except FileNotFoundError:
        raise NotFound(f"chat session {name!r} has no archive yet") from None
    except (Rejected, OSError) as exc:
        raise _fail(name, exc) from None
    return decode_record(data, name)


def _acquire_lock(sfd: int, name: str, *, record_pid: bool = True) -> int:
    """Take the session's exclusive lock (non-blocking); a chat records its pid in it, a
    removal does not (it changes nothing it does not remove)."""
    try:
        fd = os.open(LOCK, _LOCK_FLAGS, _fs.FILE_MODE, dir_fd=sfd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise ArchiveError(f"chat session {name!r}: its lock file is a link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise ArchiveError(f"chat session {name!r}: its lock file is not a private file")
        if stat.S_IMODE(st.st_mode) != _fs.FILE_MODE:
            os.fchmod(fd, _fs.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _lock_pid(fd)
            holder = f" (pid {pid})" if pid else ""
            raise Conflict(
                f"chat session {name!r} is in use by another live werk process{holder}"
            ) from None
        if record_pid:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_pid(fd: int) -> int:
    """The pid a chat recorded in the lock file, if that process still exists (a purge holds
    the lock without recording itself, so the file can name an earlier, finished holder)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(os.pread(fd, MAX_LOCK_BYTES, 0).decode("ascii").strip() or "0")
        if pid > 0:
            os.kill(pid, 0)
            return pid
    return 0


def _same_entry(parent: int, name: str, held: int) -> bool:
    """Whether ``parent/name`` is still the directory ``held`` was opened on."""
    try:
        now = _fs.lstat_at(name, parent)
    except FileNotFoundError:
        return False
    st = os.fstat(held)
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _remove_leftovers(sfd: int) -> None:
    """Temporary files of an interrupted atomic save (only we write here, under the lock)."""
    for entry in os.listdir(sfd):
        if entry.startswith((_fs.TMP_PREFIX, TRASH_PREFIX)):
            _fs.remove_entry(sfd, entry)


def _trash(parent: int, name: str) -> bool:
    """Rename ``parent/name`` to a trash name (fsynced), then delete it without following."""
    trash = TRASH_PREFIX + secrets.token_hex(8)
    try:
        os.rename(name, trash, src_dir_fd=parent, dst_dir_fd=parent)
    except FileNotFoundError:
        return False
    _fs.fsync_dir(parent)
    _fs.remove_entry(parent, trash)
    _fs.fsync_dir(parent)
    return True
