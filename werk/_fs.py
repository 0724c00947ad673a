"""No-follow, owner-only file-system primitives for the state catalog, plus fault injection.

Every path below the store root is reached *relative to an open directory descriptor* with
``O_NOFOLLOW``, so a symbolic link anywhere under the store is refused by the kernel instead of
being followed. What is opened is then checked with ``fstat`` on the descriptor itself (type,
owner, exact mode, link count), so there is no window between a check and a use.

Nothing here maps errors to protocol codes: a check that fails raises :class:`Rejected`; the
kernel's own failures stay :class:`OSError`. The catalog decides what either means.

Fault injection: :data:`_FAULTS` is ``None`` in production; tests (and the crash-matrix child
process) set it to a callable that is invoked with the name of a point (``"mid_payload"``,
``"fsync_file"``, ...). It may kill the process or raise :class:`OSError` (``ENOSPC``, ``EIO``) to
stand for a failing disk. When unset, the cost is one global lookup per point.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Callable

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "TMP_PREFIX",
    "Rejected",
    "check_private_dir",
    "create_exclusive",
    "create_private_file",
    "fault",
    "fsync_dir",
    "fsync_directory",
    "fsync_file",
    "lstat_at",
    "make_private_dir",
    "open_dir",
    "open_private_file",
    "read_small",
    "remove_entry",
    "replace_private_file",
    "write_all",
]

_FAULTS: Callable[[str], None] | None = None
"""The fault hook. ``None`` (the default) means no injection at all."""

DIR_MODE = 0o700
FILE_MODE = 0o600
TMP_PREFIX = ".tmp-"
"""Temporary files inside a state directory (an atomic replace in progress or abandoned)."""

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # opening a FIFO planted in the store must not block
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC | _NONBLOCK
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC | _NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
_SYMLINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})


class Rejected(Exception):
    """An entry is not what the store layout allows (symlink, wrong type, owner or mode, ...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fault(point: str) -> None:
    """Invoke the fault hook at ``point`` when one is installed (tests only)."""
    hook = _FAULTS
    if hook is not None:
        hook(point)


def open_dir(name: str, dir_fd: int) -> int:
    """Open the directory ``name`` inside ``dir_fd`` without following a symbolic link.

    :raises Rejected: ``name`` is a symbolic link or not a directory.
    :raises FileNotFoundError: ``name`` does not exist.
    """
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _SYMLINK_ERRNOS:
            raise Rejected(f"{name!r} is a symbolic link or not a directory") from None
        raise


def check_private_dir(fd: int, what: str) -> os.stat_result:
    """Require an open directory to be owned by us with mode exactly 0700."""
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise Rejected(f"{what} is not a directory")
    if st.st_uid != os.geteuid():
        raise Rejected(f"{what} is owned by another user")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        raise Rejected(f"{what} has mode {stat.S_IMODE(st.st_mode):04o}, not 0700")
    return st


def open_private_file(name: str, dir_fd: int) -> tuple[int, os.stat_result]:
    """Open ``name`` for reading; require a regular, single-link, owner-only (0600) file.

    :raises Rejected: a symbolic link, FIFO, device, directory, hard link, foreign owner or any
        mode other than 0600.
    :raises FileNotFoundError: ``name`` does not exist.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise Rejected(f"{name!r} is a symbolic link") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            raise Rejected(f"{name!r} is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Rejected(f"{name!r} is not a regular file")
        if st.st_uid != os.geteuid():
            raise Rejected(f"{name!r} is owned by another user")
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            raise Rejected(f"{name!r} has mode {stat.S_IMODE(st.st_mode):04o}, not 0600")
        if st.st_nlink != 1:
            raise Rejected(f"{name!r} has {st.st_nlink} hard links")
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_small(name: str, dir_fd: int, limit: int) -> bytes:
    """Read a whole private file of at most ``limit`` bytes (larger is :class:`Rejected`)."""
    fd, st = open_private_file(name, dir_fd)
    try:
        if st.st_size > limit:
            raise Rejected(f"{name!r} is larger than {limit} bytes")
        chunks: list[bytes] = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise Rejected(f"{name!r} is larger than {limit} bytes")
    return data


def lstat_at(name: str, dir_fd: int) -> os.stat_result:
    """``lstat`` of ``name`` inside ``dir_fd`` (never follows a symbolic link)."""
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` (``os.write`` may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_file(fd: int) -> None:
    """``fsync`` a file. A failure propagates and is never retried as if it had succeeded."""
    fault("fsync_file")
    os.fsync(fd)


def fsync_dir(fd: int) -> None:
    """``fsync`` a directory so a create, rename or unlink inside it is durable."""
    fault("fsync_dir")
    os.fsync(fd)


def fsync_directory(path: str | os.PathLike[str]) -> None:
    """:func:`fsync_dir` for a directory named by its path."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    try:
        fsync_dir(fd)
    finally:
        os.close(fd)


def create_private_file(dir_fd: int, name: str, data: bytes) -> None:
    """Create ``name`` (it must not exist) as a 0600 file holding ``data``, and fsync it."""
    fd = create_exclusive(dir_fd, name)
    try:
        if data:
            write_all(fd, data)
        fsync_file(fd)
    finally:
        os.close(fd)


def replace_private_file(dir_fd: int, name: str, data: bytes) -> None:
    """Atomically (re)place ``name``: temporary file, fsync, rename, fsync the directory.

    A crash leaves either the old file or the new one, plus at worst a ``.tmp-`` file that the
    next reconciliation removes.
    """
    tmp = TMP_PREFIX + secrets.token_hex(8)
    try:
        create_private_file(dir_fd, tmp, data)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    fsync_dir(dir_fd)


def make_private_dir(dir_fd: int, name: str) -> None:
    """Create the directory ``name`` with mode 0700 regardless of the umask."""
    os.mkdir(name, DIR_MODE, dir_fd=dir_fd)
    fd = open_dir(name, dir_fd)
    try:
        os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)


def remove_entry(dir_fd: int, name: str) -> None:
    """Remove ``name`` inside ``dir_fd`` without following any symbolic link.

    A directory is removed recursively with descriptor-based traversal (``shutil.rmtree`` with
    ``dir_fd``, which refuses to follow links); anything else is unlinked. A missing entry is
    not an error.
    """
    try:
        st = lstat_at(name, dir_fd)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
        else:
            os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def create_exclusive(dir_fd: int, name: str) -> int:
    """Create ``name`` (it must not exist) as an empty 0600 file open for writing."""
    fd = os.open(name, _CREATE_FLAGS, FILE_MODE, dir_fd=dir_fd)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have removed owner bits
    except BaseException:
        os.close(fd)
        raise
    return fd
