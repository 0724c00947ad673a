"""A real memory-limited cgroup for tests (cgroup v2 or v1, whichever this machine delegates).

Tests that must show behaviour under a memory limit (admission control, the budget
:mod:`werk.memory.cgroup` reads) create a child of this process's own memory cgroup, write its
limit and move a subprocess into it with :meth:`LimitedCgroup.preexec`. Where the machine does
not permit it (no hierarchy mounted, the controller not delegated, not root) the context manager
raises :class:`CgroupUnavailable` with the precise reason, for a ``pytest.skip``. Every cgroup
created here is removed afterwards (its processes must have exited by then).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

__all__ = [
    "CgroupMount",
    "CgroupUnavailable",
    "LimitedCgroup",
    "cgroup_dir",
    "cgroup_mounts",
    "memory_limited_cgroup",
    "own_cgroup_path",
]


class CgroupUnavailable(Exception):
    """No memory-limited cgroup can be made here; the message says why."""


@dataclass(frozen=True)
class CgroupMount:
    root: str
    mountpoint: str
    fstype: str
    super_options: frozenset[str]


@dataclass(frozen=True)
class LimitedCgroup:
    """A child cgroup with a memory limit.

    :ivar path: its directory.
    :ivar version: 1 or 2.
    :ivar limit_bytes: the limit written to it.
    """

    path: Path
    version: Literal[1, 2]
    limit_bytes: int

    def join(self, pid: int) -> None:
        """Move ``pid`` (and the children it starts afterwards) into the cgroup."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def preexec(self) -> Callable[[], None]:
        """A ``subprocess.Popen(preexec_fn=…)`` that joins before the program starts."""
        procs = str(self.path / "cgroup.procs")

        def join_self() -> None:
            with open(procs, "w") as handle:
                handle.write(f"{os.getpid()}\n")

        return join_self

    def peak_bytes(self) -> int:
        """The most memory charged to it so far (v2 ``memory.peak``, v1
        ``memory.max_usage_in_bytes``)."""
        name = "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"
        return int((self.path / name).read_text().split()[0])

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer ended in it (v2 ``memory.events``, v1
        ``memory.oom_control``)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def stat(self) -> dict[str, int]:
        """Its ``memory.stat`` counters."""
        out = {}
        for line in (self.path / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                out[name] = int(value)
        return out


def cgroup_mounts(mountinfo: str = "/proc/self/mountinfo") -> list[CgroupMount]:
    """Every cgroup (v1) and cgroup2 mount of this process's mount namespace."""
    out = []
    with open(mountinfo) as handle:
        for line in handle:
            fields = line.split()
            sep = fields.index("-")
            if fields[sep + 1] in ("cgroup", "cgroup2"):
                out.append(
                    CgroupMount(
                        fields[3], fields[4], fields[sep + 1], frozenset(fields[sep + 3].split(","))
                    )
                )
    return out


def own_cgroup_path(controller: str, proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's cgroup path for ``controller`` (``""``: the v2 unified hierarchy)."""
    with open(proc_cgroup) as handle:
        for line in handle:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            if controller == "" and hierarchy == "0" and controllers == "":
                return path
            if controller and controller in controllers.split(","):
                return path
    return None


def cgroup_dir(mount: CgroupMount, path: str) -> Path | None:
    """The directory of cgroup ``path`` under ``mount`` (``None`` when not visible here)."""
    root = mount.root.rstrip("/")
    if root and not (path == root or path.startswith(root + "/")):
        return None
    directory = Path(mount.mountpoint) / path[len(root) :].lstrip("/")
    return directory if directory.is_dir() else None


def _v2_parent() -> Path:
    mount = next((m for m in cgroup_mounts() if m.fstype == "cgroup2"), None)
    own = own_cgroup_path("")
    if mount is None or own is None:
        raise CgroupUnavailable("no cgroup v2 hierarchy is mounted for this process")
    parent = cgroup_dir(mount, own)
    if parent is None:
        raise CgroupUnavailable(f"this process's cgroup v2 directory {own!r} is not visible")
    controllers = (parent / "cgroup.controllers").read_text().split()
    if "memory" not in controllers:
        raise CgroupUnavailable(
            f"cgroup v2 memory controller not delegated: {parent}/cgroup.controllers lists "
            f"{controllers or 'nothing'}"
        )
    subtree = parent / "cgroup.subtree_control"
    if "memory" not in subtree.read_text().split():
        try:
            subtree.write_text("+memory\n")
        except OSError as exc:
            raise CgroupUnavailable(
                f"cgroup v2 memory controller not delegated: +memory in {subtree}: {exc}"
            ) from None
    return parent


def _v1_parent() -> Path:
    mount = next(
        (m for m in cgroup_mounts() if m.fstype == "cgroup" and "memory" in m.super_options), None
    )
    own = own_cgroup_path("memory")
    if mount is None or own is None:
        raise CgroupUnavailable("no cgroup v1 memory hierarchy is mounted for this process")
    parent = cgroup_dir(mount, own)
    if parent is None:
        raise CgroupUnavailable(f"this process's cgroup v1 memory directory {own!r} is not visible")
    return parent


@contextlib.contextmanager
def memory_limited_cgroup(limit_bytes: int) -> Iterator[LimitedCgroup]:
    """A new child cgroup limited to ``limit_bytes`` (v2 preferred, else v1), removed after.

    :raises CgroupUnavailable: neither hierarchy lets this process make one (every reason).
    """
    if os.geteuid() != 0:
        raise CgroupUnavailable("creating a cgroup needs root here")
    reasons = []
    for version, parent_of, limit_file in (
        (2, _v2_parent, "memory.max"),
        (1, _v1_parent, "memory.limit_in_bytes"),
    ):
        try:
            parent = parent_of()
            child = parent / f"werk-test-{uuid.uuid4().hex[:12]}"
            child.mkdir()
        except (CgroupUnavailable, OSError) as exc:
            reasons.append(f"v{version}: {exc}")
            continue
        try:
            try:
                (child / limit_file).write_text(f"{limit_bytes}\n")
            except OSError as exc:
                raise CgroupUnavailable(f"cannot write {child}/{limit_file}: {exc}") from None
            yield LimitedCgroup(child, version, limit_bytes)  # type: ignore[arg-type]
        finally:
            _remove(child)
        return
    raise CgroupUnavailable("; ".join(reasons))


def _remove(child: Path) -> None:
    """rmdir, retried while the last processes are being reaped (EBUSY)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            child.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
