"""Reconciliation: the cleanup every mutation performs first, under the store lock.

One pass over ``runtime-state/v1``:

* ``.tmp-*`` leftovers, ``.trash-*`` deletions and *abandoned* ``.staging-*`` commits are removed.
  A staging directory is abandoned when its ``flock`` can be taken: a live writer (any process,
  any thread) holds it until its commit is published or cleaned up, and the kernel drops it
  when the writer dies.
* Expired states are deleted, pinned or not (TTL is stronger than pin).
* Malformed or corrupt state directories (bad JSON, hash or size mismatch, missing or unexpected
  files, wrong mode or owner) and unknown directories are moved to ``.quarantine/<ts>-<rand>``;
  both directories are fsynced after the move. What cannot be moved is deleted.
* Unsafe non-directory entries (symbolic links, regular files where a directory belongs) are
  unlinked without being followed.
* Quarantine is bounded by age and count; the oldest entries go first, and any entry that is not
  a plain directory with a well-formed name is deleted on sight.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import stat

import msgspec

from .. import _fs
from .._fs import TMP_PREFIX, Rejected, check_private_dir, fsync_dir, lstat_at, open_dir
from .layout import (
    LOCK_NAME,
    QUARANTINE_NAME,
    STAGING_PREFIX,
    TRASH_PREFIX,
    inspect_open_state,
    open_verified_payload,
)
from .metadata import STATE_ID_PATTERN, StoredState, principal_from_dir_name

__all__ = ["ReconcileReport", "Reconciler", "delete_state"]

_QUARANTINE_NAME = re.compile(r"^(\d{12})-[0-9a-f]{12}$")


class ReconcileReport(msgspec.Struct):
    """What one reconciliation pass did (counts, plus the ids of expired states deleted)."""

    staging_removed: int = 0
    trash_removed: int = 0
    tmp_removed: int = 0
    expired_deleted: list[tuple[str, str]] = msgspec.field(default_factory=list)
    """``(principal, state_id)`` of each expired state deleted."""
    quarantined: int = 0
    unsafe_unlinked: int = 0
    quarantine_deleted: int = 0
    expiries: dict[str, float] = msgspec.field(default_factory=dict)
    """Principal directory name → the earliest expiry among the states kept there."""


def delete_state(pdir_fd: int, name: str) -> None:
    """Delete a state atomically: rename it to ``.trash-*`` (one step), then remove the tree.

    A crash in between leaves a trash entry that the next reconciliation removes; readers see
    the state complete or not at all. The caller fsyncs ``pdir_fd`` afterwards.
    """
    trash = TRASH_PREFIX + secrets.token_hex(8)
    os.rename(name, trash, src_dir_fd=pdir_fd, dst_dir_fd=pdir_fd)
    _fs.remove_entry(pdir_fd, trash)


class Reconciler:
    """One reconciliation pass over an open, locked store root.

    :param suspects: ``(principal, state_id)`` pairs whose payload failed verification on load;
        their payloads are fully re-hashed and quarantined on mismatch.
    """

    def __init__(
        self,
        root_fd: int,
        *,
        now: float,
        quarantine_max_entries: int,
        quarantine_max_age_seconds: float,
        suspects: frozenset[tuple[str, str]] = frozenset(),
    ) -> None:
        self._root = root_fd
        self._now = now
        self._max_entries = quarantine_max_entries
        self._max_age = quarantine_max_age_seconds
        self._suspects = suspects
        self._quarantine_fd: int | None = None
        self._dir_name = ""
        self.report = ReconcileReport()

    def run(self) -> ReconcileReport:
        """The whole store: every root entry, then the quarantine bound."""
        try:
            for name in sorted(os.listdir(self._root)):
                if name in (LOCK_NAME, QUARANTINE_NAME):
                    continue
                self._root_entry(name)
            self._bound_quarantine()
        finally:
            if self._quarantine_fd is not None:
                os.close(self._quarantine_fd)
        return self.report

    def run_one(self, name: str) -> ReconcileReport:
        """One root entry (a principal's directory), as :meth:`run` treats it."""
        try:
            if name not in (LOCK_NAME, QUARANTINE_NAME):
                self._root_entry(name)
        finally:
            if self._quarantine_fd is not None:
                os.close(self._quarantine_fd)
        return self.report

    # -- the store root -------------------------------------------------------------------

    def _root_entry(self, name: str) -> None:
        try:
            st = lstat_at(name, self._root)
        except FileNotFoundError:
            return
        if name.startswith(TMP_PREFIX):
            self._remove(self._root, name)
            self.report.tmp_removed += 1
            return
        principal = principal_from_dir_name(name)
        if not stat.S_ISDIR(st.st_mode):
            self._unlink_unsafe(self._root, name)
            return
        if principal is None:
            self._quarantine(self._root, name)
            return
        try:
            pfd = open_dir(name, self._root)
        except Rejected:
            self._unlink_unsafe(self._root, name)  # replaced by a link since the lstat
            return
        except FileNotFoundError:
            return
        try:
            try:
                check_private_dir(pfd, name)
            except Rejected:
                # Wrong owner or mode: its states may have been exposed or planted. Fail closed.
                self._quarantine(self._root, name)
                return
            self._dir_name = name
            self._principal(pfd, principal)
        finally:
            os.close(pfd)

    # -- one principal's directory ----------------------------------------------------------

    def _principal(self, pfd: int, principal: str) -> None:
        changed = False
        for name in sorted(os.listdir(pfd)):
            try:
                st = lstat_at(name, pfd)
            except FileNotFoundError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if name.startswith(STAGING_PREFIX) and is_dir:
                changed |= self._staging(pfd, name)
            elif name.startswith(TRASH_PREFIX):
                self._remove(pfd, name)
                self.report.trash_removed += 1
                changed = True
            elif not is_dir:
                self._unlink_unsafe(pfd, name)
            elif STATE_ID_PATTERN.fullmatch(name):
                changed |= self._state(pfd, name, principal)
            else:
                self._quarantine(pfd, name)
        if changed:
            fsync_dir(pfd)

    def _staging(self, pfd: int, name: str) -> bool:
        try:
            sfd = open_dir(name, pfd)
        except Rejected:
            self._unlink_unsafe(pfd, name)
            return False
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(sfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a live writer holds it: a commit in progress
            self._remove(pfd, name)
            self.report.staging_removed += 1
            return True
        finally:
            os.close(sfd)

    def _state(self, pfd: int, name: str, principal: str) -> bool:
        try:
            sfd = open_dir(name, pfd)
        except Rejected:
            self._unlink_unsafe(pfd, name)
            return False
        except FileNotFoundError:
            return False
        state: StoredState | None = None
        try:
            with contextlib.suppress(Rejected, PermissionError):
                check_private_dir(sfd, name)
                state = inspect_open_state(sfd, name, principal)
            suspect = (principal, name) in self._suspects
            if state is not None and not state.expired(self._now) and not suspect:
                if state.expires_at is not None:
                    known = self.report.expiries.get(self._dir_name, state.expires_at)
                    self.report.expiries[self._dir_name] = min(known, state.expires_at)
                return self._clean_tmp(sfd)
        finally:
            os.close(sfd)
        if state is not None and state.expired(self._now):
            delete_state(pfd, name)
            self.report.expired_deleted.append((principal, name))
            return True
        if state is None or not self._payload_ok(pfd, name, principal):
            self._quarantine(pfd, name)
        return False

    def _payload_ok(self, pfd: int, name: str, principal: str) -> bool:
        try:
            open_verified_payload(pfd, name, principal).close()
        except Rejected:
            return False
        return True

    def _clean_tmp(self, sfd: int) -> bool:
        leftovers = [n for n in os.listdir(sfd) if n.startswith(TMP_PREFIX)]
        for leftover in leftovers:
            self._remove(sfd, leftover)
            self.report.tmp_removed += 1
        if leftovers:
            fsync_dir(sfd)
        return False

    # -- moving aside and deleting ----------------------------------------------------------

    def _unlink_unsafe(self, dir_fd: int, name: str) -> None:
        """Remove a non-directory (or a directory that turned into a link) without following."""
        self._remove(dir_fd, name)
        fsync_dir(dir_fd)
        self.report.unsafe_unlinked += 1

    def _remove(self, dir_fd: int, name: str) -> None:
        _fs.remove_entry(dir_fd, name)

    def _quarantine(self, src_fd: int, name: str) -> None:
        """Move ``name`` into quarantine and fsync both directories; delete it if that fails."""
        target = f"{max(0, int(self._now)):012d}-{secrets.token_hex(6)}"
        try:
            qfd = self._open_quarantine()
            os.rename(name, target, src_dir_fd=src_fd, dst_dir_fd=qfd)
        except OSError:
            self._remove(src_fd, name)
            fsync_dir(src_fd)
            self.report.quarantine_deleted += 1
            return
        _fs.fault("mid_quarantine")
        fsync_dir(src_fd)
        fsync_dir(qfd)
        self.report.quarantined += 1

    def _open_quarantine(self) -> int:
        if self._quarantine_fd is not None:
            return self._quarantine_fd
        try:
            fd = open_dir(QUARANTINE_NAME, self._root)
        except Rejected:
            self._unlink_unsafe(self._root, QUARANTINE_NAME)
            fd = None
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                check_private_dir(fd, QUARANTINE_NAME)
            except Rejected:
                # Only our own bookkeeping lives here; repair the mode, or start afresh.
                if os.fstat(fd).st_uid == os.geteuid():
                    os.fchmod(fd, _fs.DIR_MODE)
                else:
                    os.close(fd)
                    self._remove(self._root, QUARANTINE_NAME)
                    fd = None
        if fd is None:
            _fs.make_private_dir(self._root, QUARANTINE_NAME)
            fsync_dir(self._root)
            fd = open_dir(QUARANTINE_NAME, self._root)
        self._quarantine_fd = fd
        return fd

    def _bound_quarantine(self) -> None:
        if self._quarantine_fd is None:
            try:
                st = lstat_at(QUARANTINE_NAME, self._root)
            except FileNotFoundError:
                return
            if not stat.S_ISDIR(st.st_mode):
                self._unlink_unsafe(self._root, QUARANTINE_NAME)
                return
        qfd = self._open_quarantine()
        keep: list[tuple[int, str]] = []
        removed = 0
        for name in os.listdir(qfd):
            match = _QUARANTINE_NAME.fullmatch(name)
            with contextlib.suppress(FileNotFoundError):
                st = lstat_at(name, qfd)
                if match is None or not stat.S_ISDIR(st.st_mode):
                    self._remove(qfd, name)  # cannot be inspected safely: delete
                    removed += 1
                elif int(match.group(1)) < self._now - self._max_age:
                    self._remove(qfd, name)
                    removed += 1
                else:
                    keep.append((int(match.group(1)), name))
        keep.sort()
        excess = len(keep) - self._max_entries
        for _, name in keep[: max(0, excess)]:
            self._remove(qfd, name)
            removed += 1
        if removed:
            fsync_dir(qfd)
            self.report.quarantine_deleted += removed
