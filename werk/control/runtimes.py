"""Owning live runtimes: one per configured model, started on demand, restarted with backoff,
unloaded when idle past their keep-alive.

A runtime that its plugin marks dead (``runtime.alive = False``) is stopped and reaped on the
next request for its model, and a new one (with a new process generation) is started — unless
the previous start failed less than the backoff interval ago, in which case the request fails
fast with a retryable ``unavailable``.

**Keep-alive.** Work on a runtime holds a :class:`Use` (:meth:`RuntimeManager.use`: taken under
the model's lock, so an unload never races a start of work); when the last use ends, the runtime
is idle until ``now + keep_alive`` (the server's ``--keep-alive``, or the keep-alive of the
request that ended last, like Ollama's ``keep_alive``). ``0`` unloads right after the work,
``None`` never. :meth:`RuntimeManager.unload_idle` stops runtimes idle past that point, skipping
any the caller protects (a live handoff, a pinned in-memory state).

**Admission.** When the backend gives a :class:`werk.RuntimeRequirement` for the model, its bytes
are reserved with the :class:`werk.memory.MemoryManager` before the start (in a worker thread:
sampling and relief are synchronous), committed once the runtime is up and released when it
is stopped. A reservation that does not fit makes the manager run one bounded relief pass
through this class's callbacks: loaded runtimes are the candidates (least recently used first;
one that is busy, starting, holding a live handoff or a pinned in-memory state is skipped) and
an action stops one under its model lock. When it still does not fit, the start fails with a
retryable ``resource_exhausted`` naming the requirement and what is available; nothing loaded
is touched.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import msgspec

from ..backends import ModelSpec, Runtime
from ..memory.filecache import ModelFileLease
from ..memory.manager import (
    Allocation,
    MemoryManager,
    MemoryTier,
    ReliefCallbacks,
    Reservation,
)
from ..memory.relief import ReliefAction, ReliefCandidate
from ..plugins import WerkPluginManager
from ..protocol import CapabilityId, Unavailable, WerkError
from . import admission
from .runtime_entries import LoadingEntry, RuntimeEntry

if TYPE_CHECKING:
    from .volatile import VolatileStates

__all__ = ["DEFAULT_KEEP_ALIVE_SECONDS", "KeepAlive", "RuntimeManager", "Use"]

log = logging.getLogger("werk.runtimes")

BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0
DEFAULT_KEEP_ALIVE_SECONDS = 300.0
"""``werk serve --keep-alive``'s default (5 minutes, as Ollama)."""


class KeepAlive(msgspec.Struct, frozen=True):
    """A request's own keep-alive: ``seconds`` idle before unloading, ``None`` = never."""

    seconds: float | None


class Use:
    """Work in progress on one runtime; :meth:`release` (idempotent) starts its idle time."""

    def __init__(self, manager: RuntimeManager, runtime: Runtime) -> None:
        self._manager: RuntimeManager | None = manager
        self.runtime = runtime

    def release(self, keep_alive: KeepAlive | None = None) -> None:
        """End the use; ``keep_alive`` (a request's own) replaces the server's for this
        runtime from now on, like Ollama's ``keep_alive``."""
        manager, self._manager = self._manager, None
        if manager is not None:
            manager._release(self.runtime, keep_alive)

    def __enter__(self) -> Use:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def _still_alive(runtime: Runtime) -> bool:
    """``runtime.alive``, after asking the kernel about the runtime's own process.

    A plugin learns of its child's exit on the event loop (a pidfd callback, or a poll at its
    next use), so right after a crash the flag can still say alive while the process is gone:
    a use would get the dead runtime and fail instead of starting a new one. When ``pid`` is
    Werk's child and has exited (not yet reaped: ``WNOWAIT`` leaves the reaping and the exit
    report to the plugin), the runtime is marked dead here. One ``waitid`` call.
    """
    if runtime.alive and runtime.pid is not None and _exited(runtime.pid):
        runtime.alive = False
    return runtime.alive


def _exited(pid: int) -> bool:
    if not hasattr(os, "waitid"):  # not on Windows; the plugin's own detection then
        return False
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except OSError:  # ChildProcessError: not Werk's child, or reaped (then its plugin knows)
        return False
    return info is not None


def _owner(model: str) -> str:
    """The memory-accounting owner (and relief candidate id) of a model's runtime."""
    return f"model {model}"


def _no_generations() -> frozenset[str]:
    return frozenset()


class RuntimeManager:
    """Starts, caches and stops runtimes through their backends' descriptors.

    :param memory: admission control for backends that give a requirement (``None``: none).
    :param handoff_generations: generations a live handoff refers to (relief skips them).
    :param pinned_generations: generations holding a pinned in-memory state (skipped too).
    :param cache_release: after a runtime's stop, release the page cache of its model files
        (``WERK_MODEL_CACHE_RELEASE``; see :mod:`werk.memory.filecache`). Leases on the files
        are taken either way.
    """

    def __init__(
        self,
        pm: WerkPluginManager,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        keep_alive: float | None = DEFAULT_KEEP_ALIVE_SECONDS,
        memory: MemoryManager | None = None,
        handoff_generations: Callable[[], Collection[str]] = _no_generations,
        pinned_generations: Callable[[], Collection[str]] = _no_generations,
        cache_release: bool = False,
        relief_states: VolatileStates | None = None,
    ):
        if keep_alive is not None and keep_alive < 0:
            raise ValueError("keep_alive must be >= 0 seconds or None (never)")
        self._pm = pm
        self._clock = clock
        self._wall = wall
        self.keep_alive = keep_alive
        self._runtimes: dict[str, Runtime] = {}
        self._started: dict[str, float] = {}
        self._busy: dict[str, int] = {}
        self._idle_until: dict[str, float | None] = {}
        self._keep: dict[str, float | None] = {}
        self._released: anyio.Event | None = None
        self._wake_at = 0.0  # when a wait_for_release sleeper wakes up by itself
        self._locks: dict[str, anyio.Lock] = {}
        self._failures: dict[str, tuple[int, float]] = {}
        self._retired: set[str] = set()
        self._memory = memory
        self._handoff_generations = handoff_generations
        self._pinned_generations = pinned_generations
        self._relief_states = relief_states  # ram states relief may evict too
        self._allocations: dict[str, Allocation] = {}
        self._leases: dict[str, ModelFileLease] = {}
        self.cache_release = cache_release
        self._events: dict[str, dict[str, int]] = {}
        self._crashed: set[str] = set()
        self._last_used: dict[str, float] = {}
        self._loading: dict[str, tuple[str, str, float]] = {}  # model: (backend, phase, since)
        if memory is not None:
            memory.set_relief(
                ReliefCallbacks(candidates=self._relief_candidates, execute=self._relief_execute)
            )

    def live(self) -> dict[str, Runtime]:
        """Alive runtimes by model id (a snapshot; never starts anything)."""
        return {model: rt for model, rt in self._runtimes.items() if rt.alive}

    def event_counts(self) -> dict[str, dict[str, int]]:
        """Per backend: runtime ``starts``, ``crashes`` (found dead without being stopped) and
        ``restarts`` (a start that replaced an earlier runtime of the model)."""
        for runtime in self._runtimes.values():
            self._note_if_dead(runtime)
        return {backend: dict(counts) for backend, counts in self._events.items()}

    def _count(self, backend: str, event: str) -> None:
        counts = self._events.setdefault(backend, {"starts": 0, "crashes": 0, "restarts": 0})
        counts[event] += 1

    def _note_if_dead(self, runtime: Runtime) -> None:
        if not runtime.alive and runtime.generation not in self._crashed:
            self._crashed.add(runtime.generation)
            self._count(runtime.backend, "crashes")

    def take_retired(self) -> set[str]:
        """Generations that ended since the last call (stopped, or found dead)."""
        for runtime in self._runtimes.values():
            if not runtime.alive:
                self._note_if_dead(runtime)
                self._retired.add(runtime.generation)
        retired, self._retired = self._retired, set()
        return retired

    def generations(self) -> frozenset[str]:
        return frozenset(rt.generation for rt in self._runtimes.values() if rt.alive)

    def by_generation(self, generation: str) -> Runtime | None:
        for runtime in self._runtimes.values():
            if runtime.alive and runtime.generation == generation:
                return runtime
        return None

    def can_start(self, backend: str) -> bool:
        descriptor = self._pm.backends.get(backend)
        return descriptor is not None and descriptor.start is not None

    async def get(self, spec: ModelSpec, *, preload: bool = False) -> Runtime:
        """The live runtime for ``spec``, starting (or restarting) it when needed. It starts
        idle (its keep-alive runs); work on it should hold a :meth:`use`.

        ``preload``: a start nobody asked for yet (``werk serve`` at startup). Its reservation
        runs no relief pass (it never unloads another runtime to make room), and its failure
        starts no backoff: the first request starts the model again and answers with the
        reason."""
        lock = self._lock(spec.id)
        async with lock:
            return await self._get_locked(spec, preload=preload)

    async def use(self, spec: ModelSpec) -> Use:
        """The live runtime for ``spec`` (started when needed), held busy until the returned
        :class:`Use` is released: an idle unload never stops it meanwhile."""
        lock = self._lock(spec.id)
        current = self._runtimes.get(spec.id)
        if (
            not lock.locked()
            and current is not None
            and _still_alive(current)
            and current.model == spec
        ):
            # The common case, without the lock's two event-loop passes: the runtime is up and
            # no start or stop holds its lock (there is nothing to wait for).
            return self._busy_use(spec.id, current)
        async with lock:
            return self._busy_use(spec.id, await self._get_locked(spec))

    def _lock(self, model: str) -> anyio.Lock:
        """The model's start/stop lock (created once: ``setdefault`` would build one per call)."""
        lock = self._locks.get(model)
        if lock is None:
            lock = self._locks[model] = anyio.Lock()
        return lock

    def _busy_use(self, model: str, runtime: Runtime) -> Use:
        self._busy[model] = self._busy.get(model, 0) + 1
        self._idle_until[model] = None
        return Use(self, runtime)

    def hold(self, runtime: Runtime) -> Use:
        """Hold a runtime found some other way (a handoff's generation) busy."""
        model = runtime.model.id
        if self._runtimes.get(model) is runtime:
            self._busy[model] = self._busy.get(model, 0) + 1
            self._idle_until[model] = None
        return Use(self, runtime)

    def _release(self, runtime: Runtime, keep_alive: KeepAlive | None) -> None:
        model = runtime.model.id
        if self._runtimes.get(model) is not runtime:
            return  # stopped or replaced meanwhile
        busy = max(0, self._busy.get(model, 0) - 1)
        self._busy[model] = busy
        self._last_used[model] = self._clock()
        if keep_alive is not None:
            self._keep[model] = keep_alive.seconds
        if busy == 0:
            until = self._deadline(model)
            self._idle_until[model] = until
            if self._released is not None and until is not None and until < self._wake_at:
                self._released.set()

    async def wait_for_release(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when a runtime's last use ends and
        its keep-alive runs out before then (not after every request: the sleeper looks at
        every deadline when it wakes anyway)."""
        self._released = anyio.Event()
        self._wake_at = self._clock() + timeout
        with anyio.move_on_after(timeout):
            await self._released.wait()
        self._released = None

    def _deadline(self, model: str) -> float | None:
        keep = self._keep.get(model, self.keep_alive)
        return None if keep is None else self._clock() + keep

    async def _get_locked(self, spec: ModelSpec, *, preload: bool = False) -> Runtime:
        current = self._runtimes.get(spec.id)
        if current is not None and _still_alive(current) and current.model == spec:
            return current
        if current is not None:
            self._note_if_dead(current)
            await self._stop(spec.id, current)
        runtime = await self._start(spec, preload=preload)
        self._count(spec.backend, "starts")
        if current is not None:
            self._count(spec.backend, "restarts")
        self._started[spec.id] = self._wall()
        self._last_used[spec.id] = self._clock()
        self._busy[spec.id] = 0
        self._keep.pop(spec.id, None)
        self._idle_until[spec.id] = self._deadline(spec.id)
        return runtime

    def entries(self) -> list[RuntimeEntry]:
        """Every alive runtime with its keep-alive bookkeeping (for ``GET /werk/v1/runtimes``)."""
        now, wall = self._clock(), self._wall()
        out = []
        for model, runtime in sorted(self._runtimes.items()):
            if not runtime.alive:
                continue
            until = self._idle_until.get(model)
            out.append(
                RuntimeEntry(
                    runtime=runtime,
                    started_at=self._started.get(model, wall),
                    busy=self._busy.get(model, 0),
                    idle_until=None if until is None else wall + max(0.0, until - now),
                    keep_alive=self._keep.get(model, self.keep_alive),
                    reserved=allocation.nbytes
                    if (allocation := self._allocations.get(model)) is not None
                    else None,
                )
            )
        return out

    def loading(self) -> list[LoadingEntry]:
        """The runtimes being started now, by model id."""
        out = []
        for model, (backend, phase, since) in sorted(self._loading.items()):
            lock = self._locks.get(model)
            waiting = 1 + (lock.statistics().tasks_waiting if lock is not None else 0)
            out.append(
                LoadingEntry(
                    model=model, backend=backend, phase=phase, since=since, waiting=waiting
                )
            )
        return out

    def _phase(self, spec: ModelSpec, phase: str) -> None:
        since = self._loading.get(spec.id, ("", "", self._wall()))[2]
        self._loading[spec.id] = (spec.backend, phase, since)

    def seconds_to_next_unload(self) -> float | None:
        """Seconds until the earliest idle runtime is due to be unloaded (``None``: none is)."""
        due = [
            until
            for model, until in self._idle_until.items()
            if until is not None and model in self._runtimes and not self._busy.get(model)
        ]
        return None if not due else max(0.0, min(due) - self._clock())

    async def unload_idle(self, protected: Collection[str] = ()) -> list[str]:
        """Stop every runtime idle past its keep-alive, except those whose generation is in
        ``protected``; returns the model ids stopped. A runtime that became busy (or whose lock
        is held by a start or another stop) in the meantime is left alone."""
        stopped = []
        for model in list(self._runtimes):
            until = self._idle_until.get(model)
            if until is None or until > self._clock() or self._busy.get(model):
                continue
            lock = self._lock(model)
            if lock.locked():
                continue
            async with lock:
                runtime = self._runtimes.get(model)
                until = self._idle_until.get(model)
                if (
                    runtime is None
                    or self._busy.get(model)
                    or until is None
                    or until > self._clock()
                    or runtime.generation in protected
                ):
                    continue
                log.info(
                    "unloading model %s (generation %s): idle past its keep-alive",
                    model,
                    runtime.generation,
                )
                await self._stop(model, runtime)
                stopped.append(model)
        return stopped

    async def _start(self, spec: ModelSpec, *, preload: bool = False) -> Runtime:
        descriptor = self._pm.backends.get(spec.backend)
        if descriptor is None or descriptor.start is None:
            raise Unavailable(
                f"backend {spec.backend!r} cannot start a runtime on this machine",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        failures, last = self._failures.get(spec.id, (0, 0.0))
        wait = min(BACKOFF_MAX_SECONDS, BACKOFF_INITIAL_SECONDS * 2 ** max(failures - 1, 0))
        if failures and self._clock() - last < wait:
            raise Unavailable(
                f"model {spec.id!r} failed to start recently; retrying after {wait:.0f}s",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        requirement = (
            await admission.requirement(descriptor, spec) if self._memory is not None else None
        )
        reservation: Reservation | None = None
        lease: ModelFileLease | None = None
        starting = False
        try:
            if requirement is not None and self._memory is not None:
                self._phase(spec, "reserving memory")
                reservation = await anyio.to_thread.run_sync(
                    admission.reserve, self._memory, _owner(spec.id), spec, requirement, not preload
                )
            self._phase(spec, "opening files")
            lease = await anyio.to_thread.run_sync(ModelFileLease.acquire, spec.files)
            starting = True
            self._phase(spec, "starting")
            runtime = await descriptor.start_runtime(spec)
        except BaseException as exc:
            self._loading.pop(spec.id, None)
            if reservation is not None and self._memory is not None:
                self._memory.cancel(reservation)
            if lease is not None:
                with anyio.CancelScope(shield=True):
                    await self._end_lease(spec.id, lease, stopped=True)
            if not starting or not isinstance(exc, Exception):
                raise  # no room (resource_exhausted) is not a failed start: no backoff
            if not preload:
                self._failures[spec.id] = (failures + 1, self._clock())
            if isinstance(exc, WerkError):
                raise
            log.exception("starting %s for model %s failed", spec.backend, spec.id)
            raise Unavailable(
                f"backend {spec.backend!r} could not start model {spec.id!r} "
                f"({type(exc).__name__})",
                capability=CapabilityId.MODEL_RESIDENCY,
            ) from None
        if reservation is not None and self._memory is not None:
            self._allocations[spec.id] = self._memory.commit(reservation, reservation.nbytes)
        self._loading.pop(spec.id, None)
        self._failures.pop(spec.id, None)
        self._runtimes[spec.id] = runtime
        if lease is not None:
            self._leases[spec.id] = lease
        return runtime

    async def _end_lease(self, model: str, lease: ModelFileLease, *, stopped: bool) -> None:
        """End a runtime's file leases; its page cache is released only when its backend's
        stop succeeded (its processes are gone) and release is on."""
        drop = self.cache_release and stopped
        results = await anyio.to_thread.run_sync(lambda: lease.release(drop_cache=drop))
        released = sum(1 for r in results if r.outcome == "released")
        kept = [f"{Path(r.path).name} ({r.outcome})" for r in results if r.outcome != "released"]
        log.info(
            "model %s: file leases ended; page cache released for %d of %d file(s)%s",
            model,
            released,
            len(results),
            f"; kept: {', '.join(kept)}" if kept else "",
        )

    async def unbounded(self, specs: Collection[ModelSpec]) -> dict[str, str]:
        """The models among ``specs`` whose start would not be reserved, with why (see
        :func:`.admission.unbounded`)."""
        return await admission.unbounded(self._pm, specs, self._memory)

    # -- memory relief (called by the memory manager from the reserving worker thread) ------

    def _relief_candidates(self, tier: MemoryTier) -> list[ReliefCandidate]:
        return anyio.from_thread.run_sync(self._candidates_now, tier)

    def _candidates_now(self, tier: MemoryTier) -> list[ReliefCandidate]:
        handoffs = set(self._handoff_generations())
        pinned = set(self._pinned_generations())
        out = []
        for model, allocation in sorted(self._allocations.items()):
            runtime = self._runtimes.get(model)
            if runtime is None or allocation.tier != tier:
                continue
            lock = self._locks.get(model)
            out.append(
                ReliefCandidate(
                    id=_owner(model),
                    bytes=allocation.nbytes,
                    last_used=self._last_used.get(model, 0.0),
                    pinned=runtime.generation in pinned,
                    live_handoff=runtime.generation in handoffs,
                    in_use=bool(self._busy.get(model)) or (lock is not None and lock.locked()),
                )
            )
        if self._relief_states is not None:
            out += self._relief_states.relief_candidates(tier)
        return out

    def _relief_execute(self, action: ReliefAction) -> bool:
        if self._relief_states is not None and self._relief_states.owns(action.id):
            return self._relief_states.evict(action.id)
        return anyio.from_thread.run(self._unload_for_relief, action.id)

    async def _unload_for_relief(self, owner: str) -> bool:
        model = next((m for m in self._allocations if _owner(m) == owner), None)
        if model is None:
            return False
        lock = self._lock(model)
        if lock.locked():
            return False  # starting, or stopping elsewhere: not this pass's to take
        async with lock:
            runtime = self._runtimes.get(model)
            if (
                runtime is None
                or self._busy.get(model)
                or runtime.generation in set(self._handoff_generations())
                or runtime.generation in set(self._pinned_generations())
            ):
                return False
            log.info(
                "unloading model %s (generation %s) to make room for another model",
                model,
                runtime.generation,
            )
            return await self._stop(model, runtime)

    async def stop(self, model_id: str) -> bool:
        """Stop the runtime of ``model_id``; ``False`` when none was running."""
        lock = self._lock(model_id)
        async with lock:
            runtime = self._runtimes.get(model_id)
            if runtime is None:
                return False
            await self._stop(model_id, runtime)
            return True

    async def _stop(self, model_id: str, runtime: Runtime) -> bool:
        """Stop and forget one runtime; ``False`` when its backend's stop failed (then its
        memory allocation stays accounted, pinned, and counts as a failed release)."""
        self._runtimes.pop(model_id, None)
        for table in (self._started, self._busy, self._idle_until, self._keep, self._last_used):
            table.pop(model_id, None)
        self._retired.add(runtime.generation)
        allocation = self._allocations.pop(model_id, None)
        descriptor = self._pm.backends.get(runtime.backend)
        ok = True
        if descriptor is not None and descriptor.stop is not None:
            try:
                await descriptor.stop_runtime(runtime)
            except Exception:
                log.exception("stopping %s runtime for %s failed", runtime.backend, model_id)
                ok = False
        runtime.alive = False
        if allocation is not None and self._memory is not None:
            self._memory.release(allocation, _released if ok else _release_failed)
        lease = self._leases.pop(model_id, None)
        if lease is not None:
            with anyio.CancelScope(shield=True):
                await self._end_lease(model_id, lease, stopped=ok)
        return ok

    async def aclose(self) -> None:
        """Stop every runtime (server shutdown)."""
        for model_id in list(self._runtimes):
            await self.stop(model_id)


def _released() -> None:
    """The runtime's stop succeeded: its memory is free."""


def _release_failed() -> None:
    raise RuntimeError("the backend's stop failed; its memory may still be held")
