"""The crash-safe, principal-isolated state catalog (seed: "Persistent store and crash safety").

:class:`StateCatalog` is the one public entry point. Layout and read-only inspection live in
:mod:`werk.state.layout`, cleanup in :mod:`werk.state.reconcile`, prune selection in
:mod:`werk.state.prune`.

Reads (:meth:`~StateCatalog.list`, :meth:`~StateCatalog.get`, :meth:`~StateCatalog.find`,
:meth:`~StateCatalog.prune_preview`, :meth:`~StateCatalog.open_payload`) are strictly read-only:
they take no lock, create nothing, repair nothing and omit anything invalid or expired. They
are consistent without a lock because every visible change is a single ``rename``.

Mutations hold a process mutex plus ``flock`` on ``runtime-state/v1/.lock`` and reconcile first:
the whole store, or only the mutated principal's directory when nothing else can need it
(:mod:`werk.state.clean_marks` says when; it keeps filling a store linear instead of quadratic).
A commit streams its payload into ``p_x/.staging-<rand>/`` *outside* the store lock (so a
multi-gigabyte write does not block other mutations); the staging directory carries its own
``flock`` so reconciliation can tell a live commit from an abandoned one. The publishing rename
happens under the store lock.

Permissions are fail-closed: a state or principal directory that is not exactly 0700, a file
that is not exactly 0600, or anything owned by another user is omitted from reads and
quarantined by the next mutation. Only the two store directories themselves
(``runtime-state``, ``v1``), which hold no data of their own, are repaired to 0700 by a mutation.

A payload whose bytes fail verification on :meth:`~StateCatalog.open_payload` is refused with
``not_found`` and remembered; the next mutation through this catalog re-hashes and quarantines
it. (Reads never hash whole payloads, so a same-size corruption is caught on load.)
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal

from .. import _fs
from .._fs import Rejected, check_private_dir, fsync_dir, open_dir
from ..protocol.errors import NotFound, WerkError
from ..protocol.states import PruneRequest, PruneResult, StateStatus, Tier
from ._payload import Payload, write_payload
from ._root import (
    StorageError,
    check_same_dir,
    ensure_dir,
    ensure_store_root,
    open_lock,
    storage_errors,
)
from ._validate import check_commit, check_fingerprint, check_principal
from .clean_marks import CleanMarks
from .envelope import Envelope
from .layout import (
    LAST_ACCESSED,
    METADATA,
    METADATA_SHA256,
    PAYLOAD,
    PINNED,
    STAGING_PREFIX,
    copy_verified_payload,
    inspect_open_state,
    inspect_state,
    metadata_digest_line,
    open_principal_dir,
    open_store_root,
    open_verified_payload,
    scan_principal,
    scan_principal_page,
)
from .metadata import (
    SCHEMA_VERSION,
    STATE_ID_PATTERN,
    StateMetadata,
    StoredState,
    encode_metadata,
    new_state_id,
    principal_dir_name,
    principal_from_dir_name,
)
from .prefixes import longest_shared
from .prune import BusyCheck, never_busy, select
from .reconcile import Reconciler, ReconcileReport, delete_state
from .state_names import StateNames

__all__ = ["ReconcileReport", "StateCatalog", "StorageError", "StoredState"]


def _not_found() -> NotFound:
    return NotFound("no such state")


class StateCatalog:
    """Named runtime states on disk, one directory per principal. Thread-safe.

    :param home: the active ``WERK_HOME``; the store is ``home/runtime-state/v1``.
    :param max_payload_bytes: the bound on one payload (``payload_too_large`` above it).
    :param clock: seconds since the epoch (injectable for expiry tests).
    :param quarantine_max_entries: quarantine keeps at most this many entries (newest).
    :param quarantine_max_age_seconds: quarantine entries older than this are deleted.
    :param monotonic: the clock for the whole-store reconciliation interval (tests).
    """

    def __init__(
        self,
        home: Path,
        *,
        max_payload_bytes: int = 8 * 2**30,
        clock: Callable[[], float] = time.time,
        quarantine_max_entries: int = 64,
        quarantine_max_age_seconds: float = 7 * 86400,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_payload_bytes < 0 or quarantine_max_entries < 0 or quarantine_max_age_seconds < 0:
            raise ValueError("catalog bounds must not be negative")
        self._home = Path(home)
        self._max_payload = max_payload_bytes
        self._clock = clock
        self._q_entries = quarantine_max_entries
        self._q_age = quarantine_max_age_seconds
        self._mutex = threading.Lock()
        self._suspects: set[tuple[str, str]] = set()
        self._suspects_lock = threading.Lock()
        self._marks = CleanMarks(monotonic)
        self._names = StateNames()

    # -- reads (no lock, no side effects) ---------------------------------------------------

    def list(
        self,
        principal: str,
        *,
        model: str | None = None,
        tier: Tier | None = None,
        pinned: bool | None = None,
    ) -> builtins.list[StoredState]:
        """The principal's ready, unexpired states by id (creation order), optionally filtered."""
        accept = _selector(self._clock(), model, tier, pinned)
        return [s for s in self._read_states(principal) if accept(s)]

    def page(
        self,
        principal: str,
        *,
        after: str | None,
        limit: int,
        model: str | None = None,
        tier: Tier | None = None,
        pinned: bool | None = None,
    ) -> tuple[builtins.list[StoredState], bool]:
        """One page of :meth:`list` (by id, after ``after``, ``limit`` at most) and whether
        more states may follow; reads the metadata of the page's states only."""
        accept = _selector(self._clock(), model, tier, pinned)
        check_principal(principal)
        with storage_errors("be read"), self._read_principal(principal) as pfd:
            if pfd is None:
                return [], False
            names = self._names.get(principal, pfd)
            return scan_principal_page(
                pfd, principal, after=after, limit=limit, accept=accept, names=names
            )

    def counts(self) -> dict[tuple[Tier, StateStatus], int]:
        """Every principal's states by tier and status (``ready``/``expired``), read-only, for
        ``/metrics``: no principal appears in the result. Unreadable entries are skipped."""
        root = open_store_root(self._home)
        if root is None:
            return {}
        try:
            principals = [p for p in map(principal_from_dir_name, os.listdir(root)) if p]
        finally:
            os.close(root)
        now = self._clock()
        out: dict[tuple[Tier, StateStatus], int] = {}
        for principal in principals:
            try:
                states = self._read_states(principal)
            except WerkError:
                continue
            for s in states:
                key = (s.tier, StateStatus.EXPIRED if s.expired(now) else StateStatus.READY)
                out[key] = out.get(key, 0) + 1
        return out

    def get(self, principal: str, state_id: str) -> StoredState:
        """One state; ``not_found`` when unknown, expired, invalid or another principal's."""
        check_principal(principal)
        if not STATE_ID_PATTERN.fullmatch(state_id):
            raise _not_found()
        with storage_errors("be read"), self._read_principal(principal) as pfd:
            if pfd is None:
                raise _not_found()
            try:
                state = inspect_state(pfd, state_id, principal)
            except (Rejected, FileNotFoundError, PermissionError):
                raise _not_found() from None
        if state.expired(self._clock()):
            raise _not_found()
        return state

    def find(self, principal: str, *, fingerprint: str) -> builtins.list[StoredState]:
        """Ready, unexpired states whose prompt fingerprint is ``fingerprint``."""
        check_fingerprint(fingerprint)
        return [s for s in self.list(principal) if s.fingerprint == fingerprint]

    def find_prefix(
        self, principal: str, chain: Sequence[tuple[int, str]]
    ) -> builtins.list[tuple[int, StoredState]]:
        """Ready, unexpired states sharing a boundary prefix with a prompt whose chain is
        ``chain`` (:func:`werk.state.prefixes.prefix_chain`), as ``(shared position, state)``:
        the longest first, the newest first among equals."""
        if not chain:
            return []
        found = [(longest_shared(chain, s.prefixes), s) for s in self.list(principal)]
        matched = [(shared, s) for shared, s in found if shared > 0]
        return sorted(matched, key=lambda m: (m[0], m[1].created_at), reverse=True)

    def prune_preview(
        self, principal: str, request: PruneRequest, *, busy: BusyCheck = never_busy
    ) -> PruneResult:
        """What :meth:`prune` would do, computed without touching the disk."""
        chosen = select(self._read_states(principal), request, self._clock(), busy)
        return PruneResult(
            dry_run=True, selected=chosen.selected, deleted=[], skipped=chosen.skipped
        )

    def open_payload(self, principal: str, state_id: str) -> contextlib.closing[BinaryIO]:
        """The state's payload, its SHA-256 verified before it is handed out. Use with ``with``.

        A payload that fails verification is refused (``not_found``) and quarantined by the
        next mutation.
        """
        with self._verifying(principal, state_id) as pfd:
            return contextlib.closing(open_verified_payload(pfd, state_id, principal))

    def export_payload(self, principal: str, state_id: str, target: Path) -> None:
        """Write the state's payload to the new private file ``target`` (0600, never an
        existing path), its SHA-256 verified in the same pass (one read instead of two). On a
        mismatch ``target`` is removed and the state is refused like :meth:`open_payload`.
        """
        with self._verifying(principal, state_id) as pfd:
            sink = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                try:
                    copy_verified_payload(pfd, state_id, principal, sink)
                finally:
                    os.close(sink)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    target.unlink()
                raise

    @contextlib.contextmanager
    def _verifying(self, principal: str, state_id: str) -> Iterator[int]:
        """The principal's directory for a payload read; a payload that fails verification
        becomes a suspect (quarantined by the next mutation) and the read ``not_found``."""
        check_principal(principal)
        if not STATE_ID_PATTERN.fullmatch(state_id):
            raise _not_found()
        self.get(principal, state_id)  # expiry and validity
        with storage_errors("be read"), self._read_principal(principal) as pfd:
            if pfd is None:
                raise _not_found()
            try:
                yield pfd
            except (FileNotFoundError, PermissionError):
                raise _not_found() from None
            except Rejected:
                with self._suspects_lock:
                    self._suspects.add((principal, state_id))
                raise NotFound("the state failed verification and will be quarantined") from None

    def _read_states(self, principal: str) -> builtins.list[StoredState]:
        check_principal(principal)
        with storage_errors("be read"), self._read_principal(principal) as pfd:
            return [] if pfd is None else scan_principal(pfd, principal)

    @contextlib.contextmanager
    def _read_principal(self, principal: str) -> Iterator[int | None]:
        root = open_store_root(self._home)
        if root is None:
            yield None
            return
        try:
            pfd = open_principal_dir(root, principal)
        finally:
            os.close(root)
        try:
            yield pfd
        finally:
            if pfd is not None:
                os.close(pfd)

    # -- mutations ----------------------------------------------------------------------------

    def commit(
        self,
        principal: str,
        *,
        envelope: Envelope,
        model: str,
        backend: str,
        tier: Tier,
        fingerprint: str,
        payload: Payload,
        ttl_seconds: int | None,
        pinned: bool,
        logical_bytes: int | None = None,
        prefixes: tuple[str, ...] = (),
        origin: Literal["chat"] | None = None,
    ) -> StoredState:
        """Stream ``payload`` into a new state and publish it atomically. ``prefixes``: the
        prompt's prefix fingerprints (:func:`werk.state.prefixes.prefix_chain`); ``origin``:
        what kept it (``chat``: a persisted chat turn).

        :raises PayloadTooLarge: over ``max_payload_bytes``; nothing is published.
        :raises StorageError: a write, fsync or rename failed; nothing is published.
        """
        check_commit(
            principal,
            envelope=envelope,
            model=model,
            backend=backend,
            tier=tier,
            fingerprint=fingerprint,
            ttl_seconds=ttl_seconds,
            pinned=pinned,
            logical_bytes=logical_bytes,
        )
        state_id = new_state_id()
        pname = principal_dir_name(principal)
        staging = STAGING_PREFIX + secrets.token_hex(8)
        pfd, sfd = self._open_staging(pname, staging)
        try:
            with storage_errors("commit the state"):
                _fs.fault("before_staging_write")
                fd = _fs.create_exclusive(sfd, PAYLOAD)
                try:
                    size, sha256 = write_payload(fd, payload, self._max_payload)
                finally:
                    os.close(fd)
                _fs.fault("after_payload_fsync")
                created = self._clock()
                meta = StateMetadata(
                    schema=SCHEMA_VERSION,
                    id=state_id,
                    principal=principal,
                    envelope=envelope,
                    model=model,
                    backend=backend,
                    tier=tier,
                    fingerprint=fingerprint,
                    created_at=created,
                    expires_at=None if ttl_seconds is None else created + ttl_seconds,
                    logical_bytes=logical_bytes,
                    payload_bytes=size,
                    payload_sha256=sha256,
                    prefixes=prefixes,
                    origin=origin,
                )
                raw = encode_metadata(meta)
                _fs.create_private_file(sfd, METADATA, raw)
                _fs.create_private_file(sfd, METADATA_SHA256, metadata_digest_line(raw))
                if pinned:
                    _fs.create_private_file(sfd, PINNED, b"")
                fsync_dir(sfd)
                self._publish(pfd, pname, staging, state_id, meta.expires_at)
        except BaseException:
            with contextlib.suppress(OSError):  # a no-op once the rename happened
                _fs.remove_entry(pfd, staging)
            raise
        finally:
            os.close(sfd)  # releases the staging flock
            os.close(pfd)
        return StoredState.from_metadata(meta, pinned=pinned, last_accessed_at=None)

    def _open_staging(self, pname: str, staging: str) -> tuple[int, int]:
        """Reconcile, then create and ``flock`` a staging directory; return both descriptors."""
        with storage_errors("prepare a commit"), self._locked() as root:
            self._reconcile_locked(root, self._clock(), scope=pname)
            with self._marks.changing(root, pname):
                pfd = ensure_dir(root, pname)
            try:
                with self._marks.changing(root, pname):
                    _fs.make_private_dir(pfd, staging)
                sfd = open_dir(staging, pfd)
                fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "a live commit owns this"
            except BaseException:
                with contextlib.suppress(OSError):
                    _fs.remove_entry(pfd, staging)
                os.close(pfd)
                raise
        return pfd, sfd

    def _publish(
        self, pfd: int, pname: str, staging: str, state_id: str, expires_at: float | None
    ) -> None:
        """Rename the complete staging directory into place and make the rename durable."""
        with self._locked() as root, self._marks.changing(root, pname, expires_at):
            check_same_dir(root, pname, pfd)
            _fs.fault("before_rename")
            os.rename(staging, state_id, src_dir_fd=pfd, dst_dir_fd=pfd)
            try:
                _fs.fault("after_rename_before_dirsync")
                fsync_dir(pfd)
            except BaseException:
                # Not known to be durable: withdraw it rather than report success.
                with contextlib.suppress(OSError):
                    delete_state(pfd, state_id)
                    os.fsync(pfd)
                raise

    def mark_loaded(self, principal: str, state_id: str) -> None:
        """Record a successful load in ``last-accessed`` (the only writer of that file)."""
        with self._state_locked(principal, state_id, "record a load") as (_, sfd, _state):
            _fs.replace_private_file(sfd, LAST_ACCESSED, repr(self._clock()).encode("ascii"))

    def set_pinned(self, principal: str, state_id: str, pinned: bool) -> StoredState:
        """Pin or unpin a state (the ``pinned`` file appears or disappears atomically)."""
        with self._state_locked(principal, state_id, "change a pin") as (_, sfd, state):
            if pinned and not state.pinned:
                _fs.replace_private_file(sfd, PINNED, b"")
            elif not pinned and state.pinned:
                os.unlink(PINNED, dir_fd=sfd)
                fsync_dir(sfd)
            try:
                return inspect_open_state(sfd, state_id, principal)
            except Rejected as exc:
                raise StorageError(f"the state changed while being pinned: {exc}") from None

    def prune(
        self, principal: str, request: PruneRequest, *, busy: BusyCheck = never_busy
    ) -> PruneResult:
        """Delete what ``request`` selects (a dry run is :meth:`prune_preview`)."""
        if request.dry_run:
            return self.prune_preview(principal, request, busy=busy)
        check_principal(principal)
        with storage_errors("prune"), self._locked() as root:
            now = self._clock()
            pfd = open_principal_dir(root, principal)
            states = [] if pfd is None else scan_principal(pfd, principal)
            if pfd is not None:
                os.close(pfd)
            chosen = select(states, request, now, busy)
            pname = principal_dir_name(principal)
            report = self._reconcile_locked(root, now, scope=pname)
            expired = {sid for p, sid in report.expired_deleted if p == principal}
            deleted: builtins.list[str] = []
            pfd = open_principal_dir(root, principal)
            try:
                with self._marks.changing(root, pname):
                    for sid in chosen.delete:
                        if sid not in expired and pfd is not None:
                            with contextlib.suppress(FileNotFoundError):  # quarantined meanwhile
                                delete_state(pfd, sid)
                        deleted.append(sid)
                        _fs.fault("mid_prune")
                    if pfd is not None and deleted:
                        fsync_dir(pfd)
            finally:
                if pfd is not None:
                    os.close(pfd)
        return PruneResult(
            dry_run=False, selected=chosen.selected, deleted=deleted, skipped=chosen.skipped
        )

    def reconcile(self) -> ReconcileReport:
        """Run reconciliation now (every mutation also runs it first)."""
        with storage_errors("reconcile"), self._locked() as root:
            return self._reconcile_locked(root, self._clock())

    # -- locking and helpers ------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """The store root, held under the process mutex and the ``.lock`` flock."""
        with self._mutex:
            root = ensure_store_root(self._home)
            try:
                lock = open_lock(root)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    yield root
                finally:
                    os.close(lock)
            finally:
                os.close(root)

    @contextlib.contextmanager
    def _state_locked(
        self, principal: str, state_id: str, action: str
    ) -> Iterator[tuple[int, int, StoredState]]:
        check_principal(principal)
        if not STATE_ID_PATTERN.fullmatch(state_id):
            raise _not_found()
        with storage_errors(action), self._locked() as root:
            self._reconcile_locked(root, self._clock(), scope=principal_dir_name(principal))
            pfd = open_principal_dir(root, principal)
            if pfd is None:
                raise _not_found()
            try:
                try:
                    sfd = open_dir(state_id, pfd)
                except (Rejected, FileNotFoundError):
                    raise _not_found() from None
                try:
                    try:
                        check_private_dir(sfd, state_id)
                        state = inspect_open_state(sfd, state_id, principal)
                    except Rejected:
                        raise _not_found() from None
                    if state.expired(self._clock()):
                        raise _not_found()
                    yield pfd, sfd, state
                finally:
                    os.close(sfd)
            finally:
                os.close(pfd)

    def _reconcile_locked(
        self, root: int, now: float, *, scope: str | None = None
    ) -> ReconcileReport:
        """Reconcile before a mutation: the whole store, or only principal directory ``scope``
        when :class:`~werk.state.clean_marks.CleanMarks` shows nothing else can need it."""
        with self._suspects_lock:
            suspects = frozenset(self._suspects)
        reconciler = Reconciler(
            root,
            now=now,
            quarantine_max_entries=self._q_entries,
            quarantine_max_age_seconds=self._q_age,
            suspects=suspects,
        )
        outside = any(principal_dir_name(p) != scope for p, _ in suspects)
        if scope is None or outside or self._marks.needs_full_pass(root):
            report = reconciler.run()
            self._marks.after_full_pass(root, report.expiries)
        elif suspects or self._marks.needs_scan(root, scope, now):
            report = reconciler.run_one(scope)
            self._marks.after_scan(root, scope, report.expiries.get(scope))
        else:
            report = ReconcileReport()
        with self._suspects_lock:
            self._suspects -= suspects
        return report


def _selector(
    now: float, model: str | None, tier: Tier | None, pinned: bool | None
) -> Callable[[StoredState], bool]:
    """What :meth:`StateCatalog.list` and :meth:`StateCatalog.page` keep: unexpired states
    matching every filter given."""

    def accept(s: StoredState) -> bool:
        return (
            not s.expired(now)
            and (model is None or s.model == model)
            and (tier is None or s.tier == tier)
            and (pinned is None or s.pinned == pinned)
        )

    return accept
