"""Opening the store for a mutation: the store directories, the lock file, storage errors.

Only mutations come here; reads use :func:`werk.state.layout.open_store_root`, which never
creates anything. The two store directories (``runtime-state``, ``v1``) are created 0700 when
missing and repaired to 0700 when their mode drifted (they hold no data of their own); a link
or a directory of another user in their place is refused with :class:`StorageError`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .. import _fs
from .._fs import Rejected, fsync_dir, open_dir
from ..protocol.errors import InternalError, storage_refusal
from .layout import LOCK_NAME, STORE_DIRS

__all__ = [
    "StorageError",
    "check_same_dir",
    "ensure_dir",
    "ensure_store_root",
    "open_lock",
    "storage_errors",
]


class StorageError(InternalError):
    """The state store could not be read or written (``ENOSPC``, ``EIO``, an unsafe root).

    Whatever was being committed is not published and its staging entry is removed.
    """


@contextlib.contextmanager
def storage_errors(action: str) -> Iterator[None]:
    """Turn an :class:`OSError` into a :class:`StorageError` naming the action and errno; a
    full or read-only disk into :class:`werk.InsufficientStorage` / :class:`werk.ReadOnlyStorage`
    (what the client can act on)."""
    try:
        yield
    except OSError as exc:
        refusal = storage_refusal(exc, action)
        if refusal is not None:
            raise refusal from exc
        code = errno.errorcode.get(exc.errno or 0, "unknown error")
        reason = exc.strerror or str(exc)
        raise StorageError(f"the state store could not {action}: {reason} ({code})") from exc


def ensure_store_root(home: Path) -> int:
    """Open (creating as needed) ``home/runtime-state/v1``; refuse links and foreign dirs."""
    created = not home.exists()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if created:
            os.fchmod(fd, 0o700)  # the umask may have removed owner bits
        for name in STORE_DIRS:
            child = ensure_dir(fd, name, repair=True)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def ensure_dir(parent: int, name: str, *, repair: bool = False) -> int:
    """Open the private directory ``name`` in ``parent``, creating it (0700) when missing."""
    try:
        fd = open_dir(name, parent)
    except FileNotFoundError:
        with contextlib.suppress(FileExistsError):  # a concurrent creator is fine
            _fs.make_private_dir(parent, name)
            fsync_dir(parent)
        fd = _open_or_refuse(name, parent)
    except Rejected:
        raise _not_a_dir(name) from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise StorageError(f"{name!r} in the state store belongs to another user")
        if repair and stat.S_IMODE(st.st_mode) != _fs.DIR_MODE:
            os.fchmod(fd, _fs.DIR_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_or_refuse(name: str, parent: int) -> int:
    try:
        return open_dir(name, parent)
    except Rejected:
        raise _not_a_dir(name) from None


def _not_a_dir(name: str) -> StorageError:
    return StorageError(f"{name!r} in the state store is a link or not a directory")


def open_lock(root: int) -> int:
    """Open (creating as needed) the ``.lock`` file; a planted link is unlinked, not followed."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    for _ in range(2):
        try:
            fd = os.open(LOCK_NAME, flags, _fs.FILE_MODE, dir_fd=root)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.EMLINK):
                raise
            os.unlink(LOCK_NAME, dir_fd=root)
            continue
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            raise StorageError("the state store's lock file is not a regular file of ours")
        if stat.S_IMODE(st.st_mode) != _fs.FILE_MODE:
            os.fchmod(fd, _fs.FILE_MODE)
        return fd
    raise StorageError("the state store's lock file keeps turning into a link")


def check_same_dir(root: int, name: str, held_fd: int) -> None:
    """Require ``root/name`` to still be the directory ``held_fd`` was opened on."""
    try:
        now: os.stat_result | None = _fs.lstat_at(name, root)
    except FileNotFoundError:
        now = None
    held = os.fstat(held_fd)
    if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
        raise StorageError("the principal directory was replaced during the commit")
