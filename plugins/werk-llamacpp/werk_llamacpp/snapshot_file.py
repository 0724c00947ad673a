"""The file a llama.cpp state is persisted as: the server's own slot file (exactly ``n_written``
bytes), then a JSON trailer (:class:`PayloadMeta`), its length and a magic. :func:`seal` appends
the trailer and makes the file owner-only and durable; :func:`adopt` places a payload where the
server reads slot files, checks the trailer and cuts the file back to the server's bytes."""

from __future__ import annotations

import errno
import os
import shutil
import struct
from pathlib import Path
from typing import Final, Literal

import msgspec

from werk import BackendError, BackendState, StateKind, write_all

from .slots import disk_full

__all__ = ["PAYLOAD_FORMAT", "PayloadMeta", "adopt", "seal"]

PAYLOAD_FORMAT: Final = "werk-llamacpp-slot/2"
_MAGIC = b"WERKLCS1"
_TAIL = struct.Struct("<Q8s")
_MAX_META = 64 * 1024 * 1024


class PayloadMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The trailer of a snapshot file (after the server's own ``n_written`` bytes)."""

    format: Literal["werk-llamacpp-slot/1", "werk-llamacpp-slot/2"]
    generation: str
    n_saved: int
    n_written: int
    tokens: list[int]
    lineage: str = ""
    """(format 2) what the slot file depends on: :func:`werk_llamacpp.canary.lineage_of`."""


def seal(path: Path, meta: PayloadMeta) -> None:
    """Check the server's file, append the trailer, make it owner-only and durable."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        if info.st_size != meta.n_written:
            if (full := disk_full(path.parent, "seal a state's slot file")) is not None:
                raise full
            raise BackendError(
                f"the slot file has {info.st_size} bytes, llama-server reported {meta.n_written}"
            )
        os.fchmod(fd, 0o600)
        encoded = msgspec.json.encode(meta)
        os.lseek(fd, 0, os.SEEK_END)
        write_all(fd, encoded + _TAIL.pack(len(encoded), _MAGIC))
        os.fsync(fd)
    finally:
        os.close(fd)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def adopt(payload: BackendState, dest: Path) -> PayloadMeta:
    """Place the payload at ``dest`` (a rename when possible), check and strip its trailer."""
    if payload.kind is StateKind.BYTES:
        assert payload.data is not None
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            write_all(fd, payload.data)
        finally:
            os.close(fd)
    else:
        assert payload.path is not None
        _move_or_copy(payload.path, dest)
    fd = os.open(dest, os.O_RDWR | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if size < _TAIL.size:
            raise BackendError("the snapshot payload is truncated")
        meta_len, magic = _TAIL.unpack(os.pread(fd, _TAIL.size, size - _TAIL.size))
        if magic != _MAGIC:
            raise BackendError("the payload is not a Werk llama.cpp snapshot")
        if not 0 < meta_len <= min(_MAX_META, size - _TAIL.size):
            raise BackendError("the snapshot payload's trailer is malformed")
        body_len = size - _TAIL.size - meta_len
        raw = os.pread(fd, meta_len, body_len)
        try:
            meta = msgspec.json.decode(raw, type=PayloadMeta, strict=True)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise BackendError(f"the snapshot payload's trailer is malformed ({exc})") from None
        if meta.n_written != body_len or meta.n_written <= 0:
            raise BackendError("the snapshot payload's length disagrees with its trailer")
        if not meta.tokens or meta.n_saved < len(meta.tokens):
            raise BackendError("the snapshot payload's token counts are inconsistent")
        os.ftruncate(fd, body_len)
    finally:
        os.close(fd)
    return meta


def _move_or_copy(source: Path, dest: Path) -> None:
    try:
        os.rename(source, dest)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    src_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        dst_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(src_fd, "rb", closefd=False) as src, os.fdopen(dst_fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
    finally:
        os.close(src_fd)
