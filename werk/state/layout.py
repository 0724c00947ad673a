"""The on-disk layout of the state store, and strictly read-only inspection of it.

::

    WERK_HOME/runtime-state/v1/
    ├── .lock                       advisory lock (flock) serialising every mutation
    ├── .quarantine/<ts>-<rand>/    corrupt entries moved aside (bounded)
    └── p_<principal>/              p_local, or p_ + 64 hex digits
        ├── .staging-<rand>/        a commit in progress (flock held by its writer)
        ├── .trash-<rand>/          a deletion in progress (removed under the store lock)
        └── st_<id>/
            ├── metadata.json       StateMetadata (strict JSON)
            ├── metadata.sha256     SHA-256 hex of metadata.json, then a newline
            ├── payload.bin         the adapter's opaque bytes (size and hash in metadata)
            ├── last-accessed       seconds since the epoch, written after a successful load
            └── pinned              empty; present only while pinned

Directories are 0700 and files 0600, owned by the effective user. Everything in this module
only *reads*: it never creates, repairs, renames, deletes or touches anything, so a store can be
listed, inspected and previewed without changing a byte on disk. Anything that does not match
the layout exactly (a symbolic link, a wrong type, owner, mode or link count, a missing or
unexpected file, bad JSON, a hash or size mismatch) is :class:`~werk.state._fs.Rejected`, and
readers omit it (fail closed); the next mutation's reconciliation quarantines or unlinks it.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import io
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from .._fs import (
    TMP_PREFIX,
    Rejected,
    check_private_dir,
    open_dir,
    open_private_file,
    read_small,
    write_all,
)
from .metadata import (
    STATE_ID_PATTERN,
    StoredState,
    decode_metadata,
    principal_dir_name,
)

__all__ = [
    "CHUNK",
    "LAST_ACCESSED",
    "LOCK_NAME",
    "METADATA",
    "METADATA_SHA256",
    "PAYLOAD",
    "PINNED",
    "QUARANTINE_NAME",
    "STAGING_PREFIX",
    "STORE_DIRS",
    "TRASH_PREFIX",
    "inspect_open_state",
    "inspect_state",
    "metadata_digest_line",
    "open_principal_dir",
    "open_store_root",
    "open_verified_payload",
    "scan_principal",
    "scan_principal_page",
    "state_names",
]

STORE_DIRS = ("runtime-state", "v1")
LOCK_NAME = ".lock"
QUARANTINE_NAME = ".quarantine"
STAGING_PREFIX = ".staging-"
TRASH_PREFIX = ".trash-"

METADATA = "metadata.json"
METADATA_SHA256 = "metadata.sha256"
PAYLOAD = "payload.bin"
LAST_ACCESSED = "last-accessed"
PINNED = "pinned"
STATE_FILES = frozenset({METADATA, METADATA_SHA256, PAYLOAD, LAST_ACCESSED, PINNED})

METADATA_LIMIT = 64 * 1024
"""Metadata larger than this is rejected unread (it is a few hundred bytes in practice)."""
CHUNK = 1024 * 1024


def metadata_digest_line(raw: bytes) -> bytes:
    """The exact content of ``metadata.sha256`` for ``metadata.json`` bytes ``raw``."""
    return hashlib.sha256(raw).hexdigest().encode("ascii") + b"\n"


def open_store_root(home: Path) -> int | None:
    """Open ``home/runtime-state/v1`` read-only; ``None`` when missing or unsafe (never creates).

    ``home`` itself is the operator's choice and may be reached through a link; the two store
    directories below it must be real, private directories.
    """
    try:
        fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return None
    for name in STORE_DIRS:
        try:
            child = open_dir(name, fd)
        except (Rejected, FileNotFoundError, PermissionError):
            os.close(fd)
            return None
        os.close(fd)
        fd = child
        try:
            check_private_dir(fd, name)
        except Rejected:
            os.close(fd)
            return None
    return fd


def open_principal_dir(root_fd: int, principal: str) -> int | None:
    """Open a principal's directory read-only; ``None`` when missing or unsafe."""
    name = principal_dir_name(principal)
    try:
        fd = open_dir(name, root_fd)
    except (Rejected, FileNotFoundError, PermissionError):
        return None
    try:
        check_private_dir(fd, name)
    except Rejected:
        os.close(fd)
        return None
    return fd


def inspect_state(pdir_fd: int, name: str, principal: str) -> StoredState:
    """Validate the state directory ``name`` completely (except the payload hash).

    :raises Rejected: anything about it is off.
    :raises FileNotFoundError: it vanished (a concurrent prune).
    """
    if not STATE_ID_PATTERN.fullmatch(name):
        raise Rejected(f"{name!r} is not a state id")
    fd = open_dir(name, pdir_fd)
    try:
        check_private_dir(fd, name)
        return inspect_open_state(fd, name, principal)
    finally:
        os.close(fd)


def inspect_open_state(sfd: int, name: str, principal: str) -> StoredState:
    """:func:`inspect_state` for an already opened (and checked) state directory."""
    try:
        for entry in os.listdir(sfd):
            if entry not in STATE_FILES and not entry.startswith(TMP_PREFIX):
                raise Rejected(f"unexpected entry {entry!r}")
        raw = read_small(METADATA, sfd, METADATA_LIMIT)
        if read_small(METADATA_SHA256, sfd, 128) != metadata_digest_line(raw):
            raise Rejected("metadata hash mismatch")
        try:
            meta = decode_metadata(raw)
        except ValueError as exc:
            raise Rejected(str(exc)) from None
        if meta.id != name or meta.principal != principal:
            raise Rejected("metadata names another state or principal")
        if meta.envelope.principal != principal:
            raise Rejected("envelope names another principal")
        if meta.expires_at is not None and meta.expires_at < meta.created_at:
            raise Rejected("expiry precedes creation")
        fd, st = open_private_file(PAYLOAD, sfd)
        os.close(fd)
        if st.st_size != meta.payload_bytes:
            raise Rejected("payload size mismatch")
        pinned = _read_flag(sfd)
        last = _read_last_accessed(sfd)
    except FileNotFoundError as exc:
        raise Rejected(f"missing file {exc.filename!r}") from None
    return StoredState.from_metadata(meta, pinned=pinned, last_accessed_at=last)


def _read_flag(sfd: int) -> bool:
    try:
        read_small(PINNED, sfd, 0)
    except FileNotFoundError:
        return False
    return True


def _read_last_accessed(sfd: int) -> float | None:
    try:
        raw = read_small(LAST_ACCESSED, sfd, 64)
    except FileNotFoundError:
        return None
    try:
        value = float(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise Rejected("malformed last-accessed") from None
    if not math.isfinite(value) or value < 0:
        raise Rejected("malformed last-accessed")
    return value


def scan_principal(pdir_fd: int, principal: str) -> list[StoredState]:
    """Every valid state of a principal, expired ones included, by id (creation order for ids
    from :func:`werk.state.metadata.new_state_id`), read-only."""
    return scan_principal_page(pdir_fd, principal, after=None, limit=None)[0]


def state_names(pdir_fd: int) -> list[str]:
    """The sorted names of a principal directory's entries that can be states (staging, trash
    and junk never match the id pattern)."""
    return sorted(name for name in os.listdir(pdir_fd) if STATE_ID_PATTERN.fullmatch(name))


def scan_principal_page(
    pdir_fd: int,
    principal: str,
    *,
    after: str | None,
    limit: int | None,
    accept: Callable[[StoredState], bool] = lambda state: True,
    names: Sequence[str] | None = None,
) -> tuple[list[StoredState], bool]:
    """The valid states ``accept`` takes, by id, after ``after``, ``limit`` at most; and
    whether more ids follow. Metadata is read for the states of the page (and those ``accept``
    refused on the way), not for every state; ``names`` (:func:`state_names`, when the caller
    kept them) saves listing the directory."""
    ordered = state_names(pdir_fd) if names is None else names
    start = 0 if after is None else bisect.bisect_right(ordered, after)
    found: list[StoredState] = []
    for name in itertools.islice(ordered, start, None):
        if limit is not None and len(found) == limit:
            return found, True
        try:
            state = inspect_state(pdir_fd, name, principal)
        except (Rejected, FileNotFoundError, PermissionError):
            continue
        if accept(state):
            found.append(state)
    return found, False


def copy_verified_payload(pdir_fd: int, state_id: str, principal: str, sink_fd: int) -> None:
    """Copy a state's payload to ``sink_fd`` and check its full SHA-256 in the same pass.

    One read of the payload instead of :func:`open_verified_payload`'s two (hash, then the
    caller's read): the bytes written are the bytes hashed. The sink holds unverified bytes
    until this returns; on :class:`Rejected` the caller must discard it.

    :raises Rejected: the state is invalid or its payload does not match.
    :raises FileNotFoundError: the state does not exist.
    """
    with _open_payload(pdir_fd, state_id, principal) as (stream, state):
        _hash_payload(stream, state, lambda chunk: write_all(sink_fd, chunk))


def open_verified_payload(pdir_fd: int, state_id: str, principal: str) -> BinaryIO:
    """Open a state's payload after checking its full SHA-256 against the metadata.

    The stream handed out (rewound, owned by the caller) is the very descriptor that was
    hashed, so the bytes read are the bytes verified.

    :raises Rejected: the state is invalid or its payload does not match.
    :raises FileNotFoundError: the state does not exist.
    """
    with _open_payload(pdir_fd, state_id, principal, keep_open=True) as (stream, state):
        _hash_payload(stream, state, lambda chunk: None)
        stream.seek(0)
    return stream


@contextlib.contextmanager
def _open_payload(
    pdir_fd: int, state_id: str, principal: str, *, keep_open: bool = False
) -> Iterator[tuple[io.FileIO, StoredState]]:
    """The state's payload stream (unbuffered) and its validated metadata; the stream is
    closed on the way out unless ``keep_open`` and no error occurred."""
    sfd = open_dir(state_id, pdir_fd)
    try:
        check_private_dir(sfd, state_id)
        state = inspect_open_state(sfd, state_id, principal)
        fd, _ = open_private_file(PAYLOAD, sfd)
    finally:
        os.close(sfd)
    stream = os.fdopen(fd, "rb", buffering=0)
    try:
        yield stream, state
    except BaseException:
        stream.close()
        raise
    if not keep_open:
        stream.close()


def _hash_payload(
    stream: io.FileIO, state: StoredState, each: Callable[[memoryview], None]
) -> None:
    """Read ``stream`` to its end in ``CHUNK`` pieces, hand each to ``each`` and check size and
    SHA-256 against the metadata."""
    digest = hashlib.sha256()
    total = 0
    buffer = bytearray(CHUNK)
    with memoryview(buffer) as view:
        while n := stream.readinto(buffer):
            digest.update(view[:n])
            each(view[:n])
            total += n
    if total != state.payload_bytes or digest.hexdigest() != state.payload_sha256:
        raise Rejected("payload hash mismatch")
