"""Model file-cache release: shared advisory leases on a runtime's model files while it runs,
and ``POSIX_FADV_DONTNEED`` on them once it has ended (the seed's "Model file-cache release").

A model's clean file pages stay in the OS page cache after the runtime that read them exited;
on WSL that memory is not returned to Windows until the Linux cache is dropped. With release
on, every runtime start takes a **shared** ``flock`` lease on each exact model file (the
regular files of ``ModelSpec.files``; a directory's regular files, up to
:data:`MAX_LEASED_FILES`). On unload or shutdown, after the backend's ``stop`` returned (its
processes are gone), each leased file gets a **non-blocking exclusive** lease attempt: it
succeeds only when no other lease on that file is held — another runtime of this server on the
same file, or another Werk process (``werk serve``, ``werk run``) using it. Then, if the file is
unchanged since the lease (device, inode, size, mtime), ``posix_fadvise(POSIX_FADV_DONTNEED)``
asks the kernel to drop its clean cached pages. Pages still mapped (another process using the
file), dirty or locked can stay; accepted advice is not a freed-byte measurement.

Bounded and optional: a lease that cannot be taken (a concurrent release holds the exclusive
lease for a moment; it is retried for :data:`LEASE_RETRY_SECONDS`) leaves that file unleased
and the runtime starts anyway; such a file is never released by this runtime. Other
applications do not take part in these advisory leases. Nothing is deleted.

``WERK_MODEL_CACHE_RELEASE``: ``auto`` (the default) releases on WSL only, ``on`` on every
Linux host, ``off`` never (normal OS caching). Leases are taken in every mode, so a server with
release off still protects another server's pages.
"""

from __future__ import annotations

import enum
import fcntl
import logging
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec

from ..protocol.errors import InvalidRequest

__all__ = [
    "CACHE_RELEASE_ENV",
    "LEASE_RETRY_SECONDS",
    "MAX_LEASED_FILES",
    "CacheReleaseMode",
    "FileRelease",
    "ModelFileLease",
    "cache_release_enabled",
    "is_wsl",
]

log = logging.getLogger("werk.memory")

CACHE_RELEASE_ENV = "WERK_MODEL_CACHE_RELEASE"
MAX_LEASED_FILES = 4096
LEASE_RETRY_SECONDS = 0.2


class CacheReleaseMode(enum.StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


def is_wsl(
    osrelease: str = "/proc/sys/kernel/osrelease", environ: Mapping[str, str] | None = None
) -> bool:
    """Whether this Linux runs under WSL (its kernel release names Microsoft)."""
    env = os.environ if environ is None else environ
    if env.get("WSL_DISTRO_NAME"):
        return True
    try:
        with open(osrelease) as handle:
            return "microsoft" in handle.read().lower()
    except OSError:
        return False


def cache_release_enabled(
    environ: Mapping[str, str] | None = None, *, wsl: bool | None = None
) -> bool:
    """Whether model file caches are released after unload (``WERK_MODEL_CACHE_RELEASE``).

    :raises werk.InvalidRequest: the variable holds something other than auto, on or off.
    """
    env = os.environ if environ is None else environ
    raw = env.get(CACHE_RELEASE_ENV, CacheReleaseMode.AUTO).strip().lower() or "auto"
    try:
        mode = CacheReleaseMode(raw)
    except ValueError:
        raise InvalidRequest(
            f"{CACHE_RELEASE_ENV} must be auto, on or off, not {raw[:40]!r}"
        ) from None
    if mode is CacheReleaseMode.AUTO:
        return is_wsl(environ=env) if wsl is None else wsl
    return mode is CacheReleaseMode.ON


class FileRelease(msgspec.Struct, frozen=True):
    """What the release did for one file.

    :ivar outcome: ``released`` (advice accepted), ``kept: release off``, ``kept: leased
        elsewhere`` (another lease holds it), ``kept: changed`` (not the file that was leased),
        ``kept: not leased`` or ``failed: <reason>``.
    """

    path: str
    outcome: str


class _Leased(msgspec.Struct):
    path: str
    fd: int
    identity: tuple[int, int, int, int]


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _regular_files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            for root, _dirs, files in os.walk(path):
                out.extend(Path(root) / name for name in sorted(files))
        else:
            out.append(path)
    return [p for p in out if p.is_file()][:MAX_LEASED_FILES]


class ModelFileLease:
    """Shared leases on one runtime's model files; :meth:`release` ends them (once)."""

    def __init__(self, leased: list[_Leased], unleased: list[FileRelease]) -> None:
        self._leased = leased
        self._unleased = unleased

    @classmethod
    def acquire(cls, paths: Iterable[Path]) -> ModelFileLease:
        """Take a shared lease on each regular file (never raises; see the module docs)."""
        leased: list[_Leased] = []
        unleased: list[FileRelease] = []
        for path in _regular_files(paths):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                unleased.append(FileRelease(str(path), f"kept: not leased ({exc.strerror})"))
                continue
            if _lock(fd, fcntl.LOCK_SH, LEASE_RETRY_SECONDS):
                leased.append(_Leased(str(path), fd, _identity(os.fstat(fd))))
            else:
                os.close(fd)
                unleased.append(FileRelease(str(path), "kept: not leased (lease busy)"))
        return cls(leased, unleased)

    @property
    def paths(self) -> list[str]:
        """The files this lease holds."""
        return [entry.path for entry in self._leased]

    def release(self, *, drop_cache: bool) -> list[FileRelease]:
        """End every lease; with ``drop_cache``, release each file's cached pages where no other
        lease holds it and it is unchanged. Call after the runtime's processes are gone."""
        leased, self._leased = self._leased, []
        results = list(self._unleased)
        self._unleased = []
        for entry in leased:
            try:
                results.append(FileRelease(entry.path, _release_one(entry, drop_cache)))
            finally:
                os.close(entry.fd)
        for result in results:
            log.debug("model file cache %s: %s", result.path, result.outcome)
        return results


def _lock(fd: int, kind: int, patience: float) -> bool:
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        except OSError:
            return False


def _release_one(entry: _Leased, drop_cache: bool) -> str:
    if not drop_cache:
        return "kept: release off"
    # Converting the shared lease to an exclusive one succeeds only if no other lease is held.
    if not _lock(entry.fd, fcntl.LOCK_EX, 0.0):
        return "kept: leased elsewhere"
    try:
        now = _identity(os.stat(entry.path))
    except OSError:
        return "kept: changed"
    if now != entry.identity or _identity(os.fstat(entry.fd)) != entry.identity:
        return "kept: changed"
    try:
        os.posix_fadvise(entry.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        return f"failed: {exc.strerror}"
    return "released"
