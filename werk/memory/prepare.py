"""Page preparation: warming chosen byte ranges of a model file before a native load (Linux).

The seed's "CPU expert page preparation", backend-neutral: a backend names the byte ranges of
a file that its native engine will read at random later (a MoE model's expert tensors), and
:func:`prepare_pages` makes their pages resident and mapped before the engine starts:

* only **complete OS pages** inside the ranges are touched (pages shared with a neighbouring
  tensor stay for the native loader);
* the host/cgroup memory budget is checked first, and again between chunks ("pressure");
* each chunk (at most :data:`CHUNK_BYTES`) gets a read-only shared mapping; ``mincore`` counts
  the pages already resident; when some are missing, ``POSIX_FADV_WILLNEED`` reads exactly
  the chunk's range; ``MADV_RANDOM`` turns off fault read-around on Werk's mapping (so no page
  outside the ranges is read because of it) and ``madvise(MADV_POPULATE_READ)`` establishes
  readable page-table entries. Mapped pages share the page
  cache with the engine's own mapping (nothing is copied) and resist cache-only trimming;
  normal memory pressure can still reclaim them — this is not a residency guarantee, and
  nothing is locked;
* at most :data:`MAX_WORKERS` worker threads; a deadline is checked between chunks (one
  kernel call cannot be interrupted by it);
* the deadline, pressure, a cancellation or any error **stops** it: all workers are joined and
  every mapping is dropped, and the native load proceeds as if nothing happened;
* after a completed preparation the mappings are **retained** (:class:`PreparedPages`) until
  :meth:`PreparedPages.close`, which the backend calls when its runtime stops — before the
  host's model file-cache release.

Every outcome is in :class:`PreparationReport` (``werk ps -v`` shows it).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..protocol.memory import HostMemory
from ..protocol.residency import PagePreparation
from .pages import MAP_FAILED, PAGE_SIZE, libc_calls
from .pressure import SOFT_THRESHOLD, utilisation
from .telemetry import sample_host

__all__ = [
    "CHUNK_BYTES",
    "MADV_POPULATE_READ",
    "MAX_WORKERS",
    "PageRange",
    "PreparationReport",
    "PreparedPages",
    "complete_pages",
    "host_budget",
    "prepare_pages",
    "prepare_pages_async",
]

CHUNK_BYTES = 32 * 1024 * 1024
MAX_WORKERS = 2
MADV_POPULATE_READ = 22
"""Linux 5.14+: populate (prefault) page tables readable, reading pages in as needed."""
MADV_RANDOM = 1

Budget = Callable[[int], str | None]
"""Called with the bytes still to prepare; a reason (str) stops preparation, ``None`` goes on."""


def host_budget(sampler: Callable[[], HostMemory] = sample_host) -> Budget:
    """The default budget: the host (or its cgroup) must stay below the soft pressure threshold
    (75 %) with the bytes still to prepare added; a failed sample stops preparation."""

    def check(remaining: int) -> str | None:
        try:
            host = sampler()
        except Exception as exc:
            return f"host memory could not be sampled ({type(exc).__name__})"
        if host.total_bytes <= 0:
            return "host memory capacity unknown"
        if utilisation(host.used_bytes + remaining, host.total_bytes) >= SOFT_THRESHOLD:
            return (
                f"{remaining} more bytes would take host memory past the soft threshold "
                f"({host.used_bytes} of {host.total_bytes} bytes in use)"
            )
        return None

    return check


class PageRange(msgspec.Struct, frozen=True, order=True):
    """A byte range of a file (page-aligned once passed through :func:`complete_pages`)."""

    offset: int
    length: int

    @property
    def end(self) -> int:
        return self.offset + self.length


def complete_pages(ranges: Iterable[PageRange], file_size: int) -> list[PageRange]:
    """The complete OS pages inside ``ranges`` (clipped to the file), sorted and merged."""
    pages = []
    for r in ranges:
        start = -(-max(0, r.offset) // PAGE_SIZE) * PAGE_SIZE  # round up
        end = (min(r.end, file_size) // PAGE_SIZE) * PAGE_SIZE  # round down
        if end > start:
            pages.append(PageRange(start, end - start))
    merged: list[PageRange] = []
    for r in sorted(pages):
        if merged and r.offset <= merged[-1].end:
            last = merged[-1]
            merged[-1] = PageRange(last.offset, max(last.end, r.end) - last.offset)
        else:
            merged.append(r)
    return merged


PreparationReport = PagePreparation
"""What one preparation did (the wire struct ``werk ps -v`` shows)."""


class PreparedPages:
    """The mappings a completed preparation retains; :meth:`close` unmaps them (idempotent)."""

    def __init__(self, report: PreparationReport, mappings: list[tuple[int, int]]) -> None:
        self.report = report
        self._mappings = mappings
        self._lock = threading.Lock()

    @classmethod
    def skipped(cls, reason: str) -> PreparedPages:
        """A preparation that did not run, with the reason (``skipped: <reason>``)."""
        return cls(PagePreparation(outcome=f"skipped: {reason}"), [])

    @property
    def retained_bytes(self) -> int:
        with self._lock:
            return sum(length for _, length in self._mappings)

    def close(self) -> None:
        with self._lock:
            mappings, self._mappings = self._mappings, []
        _unmap(mappings)


def _unmap(mappings: Iterable[tuple[int, int]]) -> None:
    libc = libc_calls()
    for address, length in mappings:
        libc.munmap(address, length)


def _chunks(ranges: Sequence[PageRange], chunk: int) -> list[PageRange]:
    out = []
    for r in ranges:
        offset = r.offset
        while offset < r.end:
            length = min(chunk, r.end - offset)
            out.append(PageRange(offset, length))
            offset += length
    return out


class _Stop(Exception):
    pass


def prepare_pages(
    path: Path,
    ranges: Iterable[PageRange],
    *,
    deadline_seconds: float,
    budget: Budget,
    cancel: threading.Event | None = None,
    workers: int = MAX_WORKERS,
    chunk_bytes: int = CHUNK_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> PreparedPages:
    """Prepare the complete pages of ``ranges`` in ``path`` (see the module docstring).

    Never raises for what happens while preparing: every failure is a ``stopped``/``skipped``
    report with nothing retained.
    """
    started = clock()
    workers = max(1, min(workers, MAX_WORKERS))
    chunk_bytes = max(PAGE_SIZE, (min(chunk_bytes, CHUNK_BYTES) // PAGE_SIZE) * PAGE_SIZE)

    def report(outcome: str, **counts: int) -> PreparationReport:
        return PreparationReport(outcome=outcome, seconds=round(clock() - started, 6), **counts)

    if not hasattr(os, "posix_fadvise") or os.uname().sysname != "Linux":
        return PreparedPages(report("skipped: page preparation needs Linux"), [])
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return PreparedPages(report(f"skipped: {path.name} cannot be opened ({exc.strerror})"), [])
    try:
        pages = complete_pages(ranges, os.fstat(fd).st_size)
        total = sum(r.length for r in pages)
        if not total:
            return PreparedPages(report("skipped: no complete page in the ranges"), [])
        reason = budget(total)
        if reason is not None:
            return PreparedPages(report(f"skipped: {reason}"), [])
        work: queue.SimpleQueue[PageRange] = queue.SimpleQueue()
        todo = _chunks(pages, chunk_bytes)
        for item in todo:
            work.put(item)
        state = _Shared(total)
        deadline = started + deadline_seconds

        def worker() -> None:
            libc = libc_calls()
            while not state.stopped():
                try:
                    piece = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    if cancel is not None and cancel.is_set():
                        raise _Stop("cancelled")
                    if clock() >= deadline:
                        raise _Stop(f"deadline of {deadline_seconds:g} s")
                    why = budget(state.remaining())
                    if why is not None:
                        raise _Stop(f"memory pressure ({why})")
                    _prepare_chunk(libc, fd, piece, state)
                except _Stop as stop:
                    state.stop(str(stop))
                except Exception as exc:  # any error: stop, drop everything, native load goes on
                    state.stop(f"{type(exc).__name__}: {exc}")

        threads = [
            threading.Thread(target=worker, name=f"werk-prepare-{n}", daemon=True)
            for n in range(min(workers, len(todo)))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        counts = state.counts()
        if state.reason is not None:
            _unmap(state.mappings)
            return PreparedPages(report(f"stopped: {state.reason}", **counts), [])
        retained = sum(length for _, length in state.mappings)
        return PreparedPages(
            report("completed", **counts, retained_bytes=retained), list(state.mappings)
        )
    finally:
        os.close(fd)  # the mappings keep the file's pages; the descriptor is not needed


class _Shared:
    """Counters, mappings and the stop reason shared by the workers."""

    def __init__(self, total: int) -> None:
        self._lock = threading.Lock()
        self._remaining = total
        self.reason: str | None = None
        self.mappings: list[tuple[int, int]] = []
        self.checked = self.missing = self.prefaulted = 0

    def stopped(self) -> bool:
        with self._lock:
            return self.reason is not None

    def stop(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason

    def remaining(self) -> int:
        with self._lock:
            return self._remaining

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                "checked_bytes": self.checked,
                "missing_bytes": self.missing,
                "prefaulted_bytes": self.prefaulted,
            }

    def add(self, mapping: tuple[int, int], *, checked: int, missing: int, done: int) -> None:
        with self._lock:
            self.mappings.append(mapping)
            self.checked += checked
            self.missing += missing
            self.prefaulted += done
            self._remaining -= done


def _prepare_chunk(libc: ctypes.CDLL, fd: int, piece: PageRange, state: _Shared) -> None:
    address = libc.mmap(None, piece.length, mmap.PROT_READ, mmap.MAP_SHARED, fd, piece.offset)
    if address in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap: {os.strerror(err)}")
    try:
        pages = piece.length // PAGE_SIZE
        vector = (ctypes.c_ubyte * pages)()
        if libc.mincore(address, piece.length, vector) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore: {os.strerror(err)}")
        missing = sum(1 for b in vector if not b & 1) * PAGE_SIZE
        if missing:  # read exactly this range, in large requests, before faulting it in
            os.posix_fadvise(fd, piece.offset, piece.length, os.POSIX_FADV_WILLNEED)
        # No read-around from this mapping's faults: pages outside the range stay untouched.
        if libc.madvise(address, piece.length, MADV_RANDOM) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_RANDOM): {os.strerror(err)}")
        if libc.madvise(address, piece.length, MADV_POPULATE_READ) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_POPULATE_READ): {os.strerror(err)}")
    except BaseException:
        libc.munmap(address, piece.length)
        raise
    state.add((address, piece.length), checked=piece.length, missing=missing, done=piece.length)


async def prepare_pages_async(
    path: Path, ranges: Iterable[PageRange], **options: Any
) -> PreparedPages:
    """:func:`prepare_pages` in a thread of its own. A cancellation of the caller (a signal on
    the CLI path, a server shutdown) stops it between chunks, waits for its workers and drops
    its mappings before the cancellation goes on: nothing outlives the caller."""
    import anyio

    cancel = threading.Event()
    result: list[PreparedPages] = []

    def run() -> None:
        result.append(prepare_pages(path, ranges, cancel=cancel, **options))

    thread = threading.Thread(target=run, name="werk-prepare", daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            await anyio.sleep(0.01)
    except BaseException:
        cancel.set()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(thread.join)
        for prepared in result:
            prepared.close()
        raise
    if not result:  # prepare_pages never raises; a bug must not stop the native load
        return PreparedPages(PagePreparation(outcome="stopped: preparation failed"), [])
    return result[0]
