"""A real small file system for tests of a full or read-only disk.

:func:`small_filesystem` mounts a ``tmpfs`` of a given size on a directory, so that the kernel
itself answers ``ENOSPC`` when it is full (:func:`fill` makes it so) and ``EROFS`` once it is
remounted read-only (:func:`read_only`). Where the machine does not permit mounting (not root,
no ``CAP_SYS_ADMIN`` in a container) the context manager raises :class:`FilesystemUnavailable`
with the precise reason, for a ``pytest.skip``. The mount is removed afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FilesystemUnavailable", "fill", "read_only", "small_filesystem"]


class FilesystemUnavailable(Exception):
    """No file system can be mounted here; the message says why."""


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise FilesystemUnavailable(
            f"`mount {' '.join(args)}` failed: {(done.stderr or done.stdout).strip()}"
        )


@contextlib.contextmanager
def small_filesystem(where: Path, size_bytes: int) -> Iterator[Path]:
    """A ``tmpfs`` of ``size_bytes`` mounted on ``where`` (created) until the block ends."""
    if os.geteuid() != 0:
        raise FilesystemUnavailable("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    try:
        _mount("-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(where))
    except FileNotFoundError:
        raise FilesystemUnavailable("no `mount` program") from None
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(directory: Path, name: str = "filler") -> Path:
    """Write ``directory/name`` until the file system refuses with ``ENOSPC``; return it.
    Deleting it gives the space back."""
    path = directory / name
    block = b"\0" * (64 * 1024)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last partial block
            try:
                os.write(fd, b"\0")
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return path
    finally:
        os.close(fd)


@contextlib.contextmanager
def read_only(where: Path) -> Iterator[None]:
    """``where`` (a mount made by :func:`small_filesystem`) read-only until the block ends."""
    _mount("-o", "remount,ro", str(where))
    try:
        yield
    finally:
        _mount("-o", "remount,rw", str(where))
