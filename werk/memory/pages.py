"""Page-cache residency of a file, measured with ``mincore(2)`` (Linux and other POSIX systems).

``mincore`` reports, for each page of a mapping, whether it is resident in memory; for a
read-only shared mapping of a regular file that is exactly whether the file's page is in the
page cache. Mapping a file does not read it, so measuring does not change what it measures.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import msgspec

__all__ = ["MAP_FAILED", "PAGE_SIZE", "Residency", "libc_calls", "resident_pages"]

PAGE_SIZE = mmap.PAGESIZE


class Residency(msgspec.Struct, frozen=True):
    """How many of a file range's pages are in the page cache."""

    resident: int
    total: int

    @property
    def resident_bytes(self) -> int:
        return self.resident * PAGE_SIZE

    @property
    def fraction(self) -> float:
        return self.resident / self.total if self.total else 0.0


MAP_FAILED = ctypes.c_void_p(-1).value


def libc_calls() -> ctypes.CDLL:
    """The C library with the signatures of ``mmap``, ``munmap``, ``mincore`` and ``madvise``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def resident_pages(path: Path, offset: int = 0, length: int | None = None) -> Residency:
    """Residency of ``path``'s pages in ``[offset, offset + length)`` (default: the whole file).

    :raises OSError: the file cannot be opened or mapped, or ``mincore`` fails.
    :raises ValueError: ``offset`` is not page-aligned or the range is outside the file.
    """
    if offset % PAGE_SIZE:
        raise ValueError(f"offset {offset} is not a multiple of the page size {PAGE_SIZE}")
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise ValueError(f"range {offset}+{length} is outside the {size}-byte file")
        if length == 0:
            return Residency(0, 0)
        libc = libc_calls()
        address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        if address in (None, MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of {path}: {os.strerror(err)}")
        try:
            pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, length, vector) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore of {path}: {os.strerror(err)}")
            return Residency(sum(1 for b in vector if b & 1), pages)
        finally:
            libc.munmap(address, length)
    finally:
        os.close(fd)
