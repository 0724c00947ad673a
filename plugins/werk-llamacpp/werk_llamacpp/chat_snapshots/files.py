"""Private files under a chat session's ``native/``: no-follow opens, atomic publishes and the
one-pass copy that hashes the very bytes it copies.

Every file is reached relative to an open directory descriptor with ``O_NOFOLLOW`` and checked
with ``fstat`` on the descriptor itself (type, owner, mode, link count), so there is no window
between a check and a use. A check that fails raises :class:`Unsafe`; the kernel's own failures
stay :class:`OSError`.

These mirror the host's state-store primitives (``werk/state/_fs.py``), which are not public
``werk`` names and so cannot be imported by a plugin; the messages here are the ones the chat's
``-v`` phases show.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Final

from werk import WerkError, write_all

__all__ = [
    "COPY_CHUNK",
    "TMP_PREFIX",
    "Unsafe",
    "copy_hashing",
    "copy_into",
    "create",
    "describe",
    "open_file",
    "open_private_dir",
    "read_small",
    "remove_durably",
    "unlink",
]

TMP_PREFIX: Final = ".tmp-"
"""Temporary names here: this module's copies and :func:`werk.replace_private_file`'s (the
host's atomic replace, used for the index and receipts) both start with it, so the leftover
sweep finds both."""
"""Temporary files in ``native/`` (a publish in progress or abandoned)."""
COPY_CHUNK = 1 << 20

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Unsafe(Exception):
    """A path is not what the native layout allows (a link, another owner, a wrong mode...)."""


def describe(exc: BaseException) -> str:
    """A short description of ``exc`` for a ``-v`` phase or a log line: a Werk error's message,
    the kernel's words for an :class:`OSError`, otherwise the exception's text."""
    if isinstance(exc, WerkError):
        return exc.message
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc)


def open_private_dir(path: Path) -> int:
    """Open ``path`` (a directory owned by us, mode 0700, not a symbolic link)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe(f"{path.name} is a symbolic link or not a directory") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(fd)
        raise Unsafe(f"{path.name} is not a private (0700) directory of this user")
    return fd


def open_file(dir_fd: int, name: str, *, private: bool = True) -> tuple[int, os.stat_result]:
    """Open ``name`` for reading: a regular single-link file of ours (0600 when ``private``)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO):
            raise Unsafe(f"{name} is a link or not a regular file") from None
        raise
    st = os.fstat(fd)
    bad = (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_nlink != 1
        or (private and stat.S_IMODE(st.st_mode) != 0o600)
    )
    if bad:
        os.close(fd)
        raise Unsafe(f"{name} is not a private single-link file of this user")
    return fd, st


def read_small(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A whole private file of at most ``limit`` bytes; ``None`` when it does not exist.

    :raises Unsafe: not a private file, or larger than ``limit``.
    """
    try:
        fd, st = open_file(dir_fd, name)
    except FileNotFoundError:
        return None
    try:
        if st.st_size > limit:
            raise Unsafe(f"{name} is larger than {limit} bytes")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unsafe(f"{name} is larger than {limit} bytes")
    return data


def create(dir_fd: int, name: str) -> int:
    """Create ``name`` (it must not exist) as an empty 0600 file open for writing."""
    fd = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)  # the umask may have removed owner bits
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink(dir_fd: int, name: str) -> bool:
    """Remove ``name``; ``False`` when it did not exist."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_durably(dir_fd: int, name: str) -> None:
    """Remove ``name`` and, when it existed, fsync the directory."""
    if unlink(dir_fd, name):
        os.fsync(dir_fd)


def copy_hashing(src: int, dst: int, limit: int) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` computing the SHA-256 of the very bytes copied (one pass).

    Reads at most ``limit + 1`` bytes, so a file longer than expected is noticed without
    reading all of it. Returns ``(sha256 hex, bytes copied)``.
    """
    digest = hashlib.sha256()
    copied = 0
    while copied <= limit:
        chunk = os.read(src, min(COPY_CHUNK, limit + 1 - copied))
        if not chunk:
            break
        digest.update(chunk)
        write_all(dst, chunk)
        copied += len(chunk)
    return digest.hexdigest(), copied


def copy_into(src: int, dir_fd: int, name: str, limit: int, *, sync: bool) -> tuple[str, int]:
    """Create ``name`` in ``dir_fd``, :func:`copy_hashing` ``src`` into it and close it.

    With ``sync`` the copy is fsynced when it is exactly ``limit`` bytes long (a copy of any
    other length is refused by the caller and removed, so it is never synced). Returns
    ``(sha256 hex, bytes copied)``.
    """
    dst = create(dir_fd, name)
    try:
        digest, copied = copy_hashing(src, dst, limit)
        if sync and copied == limit:
            os.fsync(dst)
    finally:
        os.close(dst)
    return digest, copied
