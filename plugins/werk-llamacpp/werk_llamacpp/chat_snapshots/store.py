"""Moving snapshot bytes between the child's slot directory and the session's ``native/``.

**Publish** (after a save): one pass copies the server's file into ``native/.tmp-…`` while
computing its SHA-256; the copy is fsynced and renamed to a fresh ``snapshot-<hex>.slot``, the
directory fsynced, and only then ``index.json`` is replaced atomically. A failure removes what
it created, so the published index always names a complete file.

**Copy in** (before a restore): the snapshot is copied into the slot directory under a fresh
private name while it is hashed; size and SHA-256 must equal the index.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

import msgspec

from werk import BackendError, replace_private_file

from .files import (
    TMP_PREFIX,
    Unsafe,
    copy_into,
    open_file,
    open_private_dir,
    unlink,
)
from .records import (
    INDEX,
    MAX_INDEX_BYTES,
    MAX_RECEIPT_BYTES,
    RECEIPT,
    SCHEMA,
    SNAPSHOT_FORMAT,
    SNAPSHOT_NAME,
    Namespace,
    Receipt,
    SnapshotIndex,
)

__all__ = [
    "RestoreFailed",
    "copy_in",
    "publish",
    "remove_leftovers",
    "remove_slot_file",
    "write_receipt",
]


class RestoreFailed(Exception):
    """The snapshot could not be restored; ``corrupt`` when the file itself is bad."""

    def __init__(self, reason: str, *, corrupt: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.corrupt = corrupt


def remove_leftovers(native: int, keep: str | None) -> None:
    """Drop ``.tmp-`` files and snapshot files other than ``keep`` (an interrupted save)."""
    removed = False
    for entry in os.listdir(native):
        stale_snapshot = SNAPSHOT_NAME.match(entry) is not None and entry != keep
        if entry.startswith(TMP_PREFIX) or stale_snapshot:
            with contextlib.suppress(IsADirectoryError, PermissionError):
                removed |= unlink(native, entry)
    if removed:
        os.fsync(native)


def remove_slot_file(slot_dir: Path, name: str) -> None:
    """Remove ``name`` from the child's slot directory (a missing file is fine)."""
    slots = open_private_dir(slot_dir)
    try:
        unlink(slots, name)
    finally:
        os.close(slots)


def publish(
    native: int,
    slot_dir: Path,
    name: str,
    *,
    n_saved: int,
    n_written: int,
    namespace: Namespace,
    conversation: str,
) -> SnapshotIndex:
    """Copy the server's ``name`` + hash in one pass, fsync, rename, fsync the directory,
    publish the index. Cleans up after itself on any failure."""
    tmp = TMP_PREFIX + secrets.token_hex(8)
    final = f"snapshot-{secrets.token_hex(16)}.slot"
    published = False
    try:
        slots = open_private_dir(slot_dir)
        try:
            src, _ = open_file(slots, name, private=False)  # the server's umask decides
        finally:
            os.close(slots)
        try:
            digest, copied = copy_into(src, native, tmp, n_written, sync=True)
        finally:
            os.close(src)
        if copied != n_written:
            raise BackendError(
                f"the server wrote {copied} bytes, not the {n_written} it acknowledged"
            )
        os.rename(tmp, final, src_dir_fd=native, dst_dir_fd=native)
        os.fsync(native)
        index = SnapshotIndex(
            schema=SCHEMA,
            format=SNAPSHOT_FORMAT,
            file=final,
            sha256=digest,
            size=copied,
            n_saved=n_saved,
            n_written=n_written,
            namespace=namespace,
            conversation_sha256=conversation,
            saved_at=time.time(),
        )
        data = msgspec.json.encode(index)
        if len(data) > MAX_INDEX_BYTES:
            raise Unsafe("the snapshot index would be oversized")
        replace_private_file(native, INDEX, data)
        published = True
    finally:
        if not published:
            for leftover in (tmp, final):
                with contextlib.suppress(OSError):
                    unlink(native, leftover)
    return index


def copy_in(native: int | None, slot_dir: Path, index: SnapshotIndex, name: str) -> None:
    """Copy the snapshot into the slot directory under ``name``, hashing the bytes copied;
    size and SHA-256 must equal the index.

    :raises RestoreFailed: (``corrupt`` when the snapshot file itself is bad).
    """
    if native is None:
        raise RestoreFailed("the native directory is gone", corrupt=True)
    try:
        slots = open_private_dir(slot_dir)
    except Unsafe as exc:
        raise RestoreFailed(f"the runtime's slot directory is unsafe ({exc})") from None
    try:
        try:
            src, st = open_file(native, index.file)
        except FileNotFoundError:
            raise RestoreFailed("the snapshot file is missing", corrupt=True) from None
        except Unsafe as exc:
            raise RestoreFailed(str(exc), corrupt=True) from None
        try:
            if st.st_size != index.size:
                raise RestoreFailed(
                    f"the snapshot has {st.st_size} bytes, the index says {index.size}",
                    corrupt=True,
                )
            digest, copied = copy_into(src, slots, name, index.size, sync=False)
        finally:
            os.close(src)
    finally:
        os.close(slots)
    if copied != index.size:
        raise RestoreFailed(
            f"the snapshot has {copied} bytes, the index says {index.size}", corrupt=True
        )
    if digest != index.sha256:
        raise RestoreFailed("the snapshot's SHA-256 does not match its index", corrupt=True)


def write_receipt(native: int | None, receipt: Receipt) -> None:
    """Replace ``capability.json`` atomically with ``receipt``."""
    if native is None:
        raise Unsafe("the native directory is gone")
    data = msgspec.json.encode(receipt)
    if len(data) > MAX_RECEIPT_BYTES:
        raise Unsafe("the receipt would be oversized")
    replace_private_file(native, RECEIPT, data)
