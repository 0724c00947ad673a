"""Reading the memory budget the Linux cgroup hierarchy imposes on this process.

A process in a container (or a systemd scope) may be limited far below physical RAM. This module
finds the process's own memory cgroup and walks from it up to the hierarchy's mount point,
collecting every finite limit on the way:

* **cgroup v2** (preferred): the unified hierarchy, when the memory controller is enabled for the
  process's cgroup (``memory.current`` is present). Limit file ``memory.max`` (``max`` means
  unlimited), usage ``memory.current``, file cache counters ``active_file``, ``inactive_file``,
  ``file_mapped``, ``file_dirty``, ``file_writeback`` in ``memory.stat``.
* **cgroup v1** (hybrid and legacy hosts): the hierarchy mounted with the ``memory`` controller.
  Limit ``memory.limit_in_bytes`` (values of 2**62 and above mean unlimited), usage
  ``memory.usage_in_bytes``, the same counters with a ``total_`` prefix (``total_mapped_file``,
  ``total_dirty``, …) in ``memory.stat``.

**Reclaimable** is the clean file cache no process maps: ``active_file + inactive_file -
mapped - dirty - writeback`` (never below 0). A model file a runtime maps is *used* even when
the kernel keeps it on the inactive list (observed here: 712 MB mapped, 721 MB inactive, while a
process held the mapping); a file read once and closed is reclaimable whether its pages are
active or inactive.

The process's cgroup path comes from ``/proc/self/cgroup``; the mount point and the mount's root
(relevant inside cgroup namespaces) from ``/proc/self/mountinfo``. The limit of a level binds
everything below it, so the effective limit is the **minimum** over the walked levels, and the
effective headroom is the minimum over those levels of ``limit - (usage - reclaimable)``.

Nothing is guessed. No cgroup filesystem, no memory controller, or a cgroup directory that is
not visible here all mean "no cgroup limit observable" (``None``). A file that exists but cannot
be read or parsed raises :class:`CgroupReadError`: a limit we cannot read is never treated as
absent.
"""

from __future__ import annotations

import os
from typing import Literal

import msgspec

__all__ = ["UNLIMITED_V1_THRESHOLD", "CgroupBudget", "CgroupReadError", "read_cgroup_budget"]

UNLIMITED_V1_THRESHOLD = 1 << 62
"""cgroup v1 reports "no limit" as a page-rounded ``LONG_MAX``; anything this large is no limit."""

_MAX_FILE_BYTES = 1 << 20


class CgroupReadError(RuntimeError):
    """A cgroup control file exists but could not be read or parsed."""


class CgroupBudget(msgspec.Struct, frozen=True, kw_only=True):
    """The binding memory limit on this process and how much of it is still free.

    :ivar version: 1 or 2, the hierarchy the numbers come from.
    :ivar path: the cgroup directory whose limit is the minimum (the binding level).
    :ivar limit_bytes: the minimum finite limit over the walked levels.
    :ivar usage_bytes: charged memory at the binding level minus its reclaimable file cache
        (clean, unmapped; never below zero).
    :ivar headroom_bytes: the minimum over limited levels of ``limit - usage`` (never below 0).
    """

    version: Literal[1, 2]
    path: str
    limit_bytes: int
    usage_bytes: int
    headroom_bytes: int


class _Mount(msgspec.Struct, frozen=True):
    root: str
    mountpoint: str
    fstype: str
    super_options: frozenset[str]


def read_cgroup_budget(
    *, proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> CgroupBudget | None:
    """The effective cgroup memory budget of the calling process, or ``None`` when unlimited.

    :param proc_cgroup: path of the process's cgroup membership file (tests pass a fake).
    :param mountinfo: path of the process's mount table (tests pass a fake).
    :raises CgroupReadError: a limit, usage or stat file is present but unreadable/malformed.
    """
    memberships = _read_memberships(proc_cgroup)
    if memberships is None:
        return None
    mounts = _read_mounts(mountinfo)
    if mounts is None:
        return None
    v2_path = memberships.get("")
    if v2_path is not None:
        v2_mount = next((m for m in mounts if m.fstype == "cgroup2"), None)
        if v2_mount is not None:
            directory = _resolve(v2_mount, v2_path)
            if directory is not None and os.path.exists(os.path.join(directory, "memory.current")):
                return _walk(2, directory, v2_mount.mountpoint)
    v1_path = memberships.get("memory")
    if v1_path is not None:
        v1_mount = next(
            (m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options), None
        )
        if v1_mount is not None:
            directory = _resolve(v1_mount, v1_path)
            if directory is not None:
                return _walk(1, directory, v1_mount.mountpoint)
    return None


# -- parsing -----------------------------------------------------------------------------------


def _read_text(path: str) -> str | None:
    """The file's text, ``None`` when it does not exist, :class:`CgroupReadError` otherwise."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CgroupReadError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if len(data) > _MAX_FILE_BYTES:
        raise CgroupReadError(f"{path} is larger than {_MAX_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CgroupReadError(f"{path} is not UTF-8") from exc


def _read_memberships(path: str) -> dict[str, str] | None:
    """Map controller name to cgroup path; ``""`` is the v2 unified entry (``0::/path``)."""
    text = _read_text(path)
    if text is None:
        return None
    result: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise CgroupReadError(f"malformed line in {path}: {line[:80]!r}")
        hierarchy, controllers, cgroup_path = parts
        if hierarchy == "0" and controllers == "":
            result[""] = cgroup_path
            continue
        for controller in controllers.split(","):
            if controller:
                result[controller] = cgroup_path
    return result


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space and friends)."""
    out: list[str] = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _read_mounts(path: str) -> list[_Mount] | None:
    text = _read_text(path)
    if text is None:
        return None
    mounts: list[_Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if sep < 5 or len(fields) < sep + 3:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            _Mount(
                root=_unescape(fields[3]),
                mountpoint=_unescape(fields[4]),
                fstype=fstype,
                super_options=frozenset(fields[sep + 3].split(",")),
            )
        )
    return mounts


def _resolve(mount: _Mount, cgroup_path: str) -> str | None:
    """The directory of ``cgroup_path`` under ``mount``, or ``None`` when it is not visible.

    ``/proc/self/cgroup`` paths are relative to the hierarchy root; the mount may expose only a
    subtree (its ``root``). A path outside the exposed subtree cannot be observed from here.
    """
    root = mount.root.rstrip("/")
    if root and cgroup_path != root and not cgroup_path.startswith(root + "/"):
        return None
    relative = cgroup_path[len(root) :].lstrip("/")
    if any(part in ("..", ".") for part in relative.split("/")):
        return None
    directory = os.path.join(mount.mountpoint, relative) if relative else mount.mountpoint
    return directory if os.path.isdir(directory) else None


# -- walking -----------------------------------------------------------------------------------


def _read_int(path: str, *, allow_max: bool) -> int | None:
    """An integer control file; ``None`` when absent or (``allow_max``) the literal ``max``."""
    text = _read_text(path)
    if text is None:
        return None
    value = text.strip()
    if allow_max and value == "max":
        return None
    try:
        number = int(value)
    except ValueError as exc:
        raise CgroupReadError(f"{path} does not hold an integer: {value[:40]!r}") from exc
    if number < 0:
        raise CgroupReadError(f"{path} holds a negative value")
    return number


def _read_stats(path: str, keys: tuple[str, ...]) -> dict[str, int]:
    """Counters of ``memory.stat``; 0 for a key (or file) that is absent (nothing to subtract)."""
    text = _read_text(path)
    found = dict.fromkeys(keys, 0)
    if text is None:
        return found
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            try:
                found[name] = max(0, int(value.strip()))
            except ValueError as exc:
                raise CgroupReadError(f"{path}: {name} is not an integer") from exc
    return found


_FILE_CACHE_KEYS = {
    2: ("active_file", "inactive_file", "file_mapped", "file_dirty", "file_writeback"),
    1: (
        "total_active_file",
        "total_inactive_file",
        "total_mapped_file",
        "total_dirty",
        "total_writeback",
    ),
}


def _reclaimable(path: str, version: Literal[1, 2]) -> int:
    """Clean file cache that no process maps (see the module docstring)."""
    active, inactive, mapped, dirty, writeback = _read_stats(
        path, _FILE_CACHE_KEYS[version]
    ).values()
    return max(0, active + inactive - mapped - dirty - writeback)


def _walk(version: Literal[1, 2], directory: str, mountpoint: str) -> CgroupBudget | None:
    limit_file, usage_file = (
        ("memory.max", "memory.current")
        if version == 2
        else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    )
    stop = os.path.normpath(mountpoint)
    current = os.path.normpath(directory)
    best: CgroupBudget | None = None
    headroom: int | None = None
    while True:
        limit = _read_int(os.path.join(current, limit_file), allow_max=version == 2)
        if limit is not None and version == 1 and limit >= UNLIMITED_V1_THRESHOLD:
            limit = None
        if limit is not None:
            charged = _read_int(os.path.join(current, usage_file), allow_max=False)
            if charged is None:
                raise CgroupReadError(f"{current} has {limit_file} but no {usage_file}")
            reclaimable = _reclaimable(os.path.join(current, "memory.stat"), version)
            usage = max(0, charged - reclaimable)
            level_headroom = max(0, limit - usage)
            headroom = level_headroom if headroom is None else min(headroom, level_headroom)
            if best is None or limit < best.limit_bytes:
                best = CgroupBudget(
                    version=version,
                    path=current,
                    limit_bytes=limit,
                    usage_bytes=usage,
                    headroom_bytes=0,
                )
        if current == stop or len(current) <= len(stop):
            break
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    if best is None or headroom is None:
        return None
    return CgroupBudget(
        version=best.version,
        path=best.path,
        limit_bytes=best.limit_bytes,
        usage_bytes=best.usage_bytes,
        headroom_bytes=headroom,
    )
