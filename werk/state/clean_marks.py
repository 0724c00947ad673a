"""What one catalog already knows to be reconciled, so a mutation does not rescan everything.

Every mutation reconciles first (seed: "Before mutation, reconciliation removes abandoned
staging entries and expired states, quarantines malformed or corrupt state directories and
unlinks unsafe non-directory entries"). Rescanning the whole store each time made filling it
quadratic: 2,000 states of one principal took 90 s to commit one by one. :class:`CleanMarks`
keeps, per directory this catalog reconciled or changed itself, a *mark* — the directory's
``(inode, mtime_ns, ctime_ns)`` — and the earliest expiry among its states. A mutation then
rescans only what may need cleanup:

* the **whole store** on the catalog's first mutation, whenever the store root's mark differs
  from the one recorded (a principal directory or stray entry appeared or went), when a state
  of another principal is suspected corrupt, and at least every
  :data:`FULL_PASS_SECONDS`;
* otherwise **the mutated principal's directory**, when its mark differs (another process or
  a crashed commit added, removed or renamed an entry: a staging leftover, a planted file), a
  state in it has expired, or one of its states is suspected corrupt;
* nothing else when the mark is unchanged and nothing has expired.

The trade-off, documented in ``docs/architecture.md``: a change *inside* a state directory that
leaves its principal directory untouched (a file edited in place) is found by the next full
pass, by any read (reads omit what does not validate) or by a load (the payload hash is
verified; the state becomes a suspect and is quarantined by the next mutation) — not by every
mutation. Directory timestamps on filesystems with coarse granularity can also hide a change
made within the same tick as one of ours; the periodic full pass bounds both.

Marks are updated only under the store lock and only when the directory was still as last
recorded before this catalog changed it; anything else forgets the mark (a rescan next time).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgspec

__all__ = ["FULL_PASS_SECONDS", "CleanMarks", "Mark"]

FULL_PASS_SECONDS = 60.0
"""The longest a catalog goes without a whole-store reconciliation before a mutation."""


class Mark(msgspec.Struct, frozen=True):
    """A directory as of one ``stat``: any entry added, removed or renamed changes it."""

    inode: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of_fd(cls, fd: int) -> Mark:
        st = os.fstat(fd)
        return cls(st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    @classmethod
    def of(cls, name: str, dir_fd: int) -> Mark | None:
        """The mark of directory ``name`` in ``dir_fd``; ``None`` if it is absent or not a
        directory."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return None
        return cls(st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


class CleanMarks:
    """The marks of one catalog (guarded by the catalog's store lock).

    :param monotonic: the clock for the full-pass interval (injectable for tests).
    """

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._root: Mark | None = None
        self._last_full: float | None = None
        self._dirs: dict[str, tuple[Mark | None, float | None]] = {}

    def needs_full_pass(self, root_fd: int) -> bool:
        return (
            self._last_full is None
            or self._monotonic() - self._last_full >= FULL_PASS_SECONDS
            or Mark.of_fd(root_fd) != self._root
        )

    def needs_scan(self, root_fd: int, name: str, now: float) -> bool:
        """Whether principal directory ``name`` must be reconciled before a mutation."""
        known = self._dirs.get(name)
        if known is None:
            return True
        mark, expiry = known
        return Mark.of(name, root_fd) != mark or (expiry is not None and expiry <= now)

    def after_full_pass(self, root_fd: int, expiries: dict[str, float]) -> None:
        """Record every principal directory as reconciled just now."""
        self._dirs = {}
        for name in os.listdir(root_fd):
            mark = Mark.of(name, root_fd)
            if mark is not None:
                self._dirs[name] = (mark, expiries.get(name))
        self._root = Mark.of_fd(root_fd)
        self._last_full = self._monotonic()

    def after_scan(self, root_fd: int, name: str, expiry: float | None) -> None:
        """Record principal directory ``name`` as reconciled just now."""
        self._dirs[name] = (Mark.of(name, root_fd), expiry)

    @contextmanager
    def changing(self, root_fd: int, name: str, expiry: float | None = None) -> Iterator[None]:
        """Around a change this catalog makes to principal directory ``name`` (and maybe the
        root, when it creates the directory): keep the marks only if nothing else changed
        them since they were recorded; ``expiry`` is that of a state being added."""
        root_before = Mark.of_fd(root_fd)
        before = Mark.of(name, root_fd)
        try:
            yield
        finally:
            known = self._dirs.get(name)
            if known is not None and known[0] == before:
                self._dirs[name] = (Mark.of(name, root_fd), _earliest(known[1], expiry))
            else:
                self._dirs.pop(name, None)
            if self._root is not None and self._root == root_before:
                self._root = Mark.of_fd(root_fd)

    def forget(self, name: str) -> None:
        self._dirs.pop(name, None)
