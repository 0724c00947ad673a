"""Streaming a payload to disk: one pass that bounds, hashes and writes each chunk.

The payload is never joined into one buffer. Files and file objects are read in 1 MiB chunks
(``readinto`` a reused buffer for paths); iterables are consumed chunk by chunk as given. The
bound is checked *before* a chunk is written, so an oversized payload never lands on disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from .. import _fs
from ..protocol.errors import InvalidRequest, PayloadTooLarge
from .layout import CHUNK

__all__ = ["Payload", "write_payload"]

Payload = Iterable[bytes] | BinaryIO | Path | bytes
"""What :meth:`~werk.state.catalog.StateCatalog.commit` accepts as the opaque payload."""

_Chunk = bytes | bytearray | memoryview


def _chunks(payload: Payload) -> Iterator[_Chunk]:
    if isinstance(payload, bytes | bytearray | memoryview):
        yield payload
    elif isinstance(payload, Path):
        with payload.open("rb", buffering=0) as stream:
            buffer = bytearray(CHUNK)
            with memoryview(buffer) as view:
                while n := stream.readinto(buffer):
                    yield view[:n]
    elif hasattr(payload, "read"):
        stream_io: BinaryIO = payload  # type: ignore[assignment]
        while chunk := stream_io.read(CHUNK):
            yield chunk
    else:
        for chunk in payload:
            if not isinstance(chunk, bytes | bytearray | memoryview):
                raise InvalidRequest("payload chunks must be bytes")
            yield chunk


def write_payload(fd: int, payload: Payload, limit: int) -> tuple[int, str]:
    """Write ``payload`` to ``fd``, fsync it, and return ``(size, sha256 hex)``.

    :raises PayloadTooLarge: the payload exceeds ``limit`` bytes (nothing past it is written).
    :raises OSError: a write or the fsync failed (``ENOSPC``, ``EIO``, ...); never retried.
    """
    digest = hashlib.sha256()
    total = 0
    for chunk in _chunks(payload):
        data = chunk if not isinstance(chunk, memoryview) else chunk.cast("B")
        total += len(data)
        if total > limit:
            raise PayloadTooLarge(f"the state payload exceeds the store's bound of {limit} bytes")
        digest.update(data)
        if _fs._FAULTS is not None:
            _fs._FAULTS("write_payload")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if _fs._FAULTS is not None:
            _fs._FAULTS("mid_payload")
    _fs.fsync_file(fd)
    return total, digest.hexdigest()
