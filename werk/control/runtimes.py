"""Owning live runtimes: one per configured model, started on demand, restarted with backoff.

A runtime that its plugin marks dead (``runtime.alive = False``) is stopped and reaped on the
next request for its model, and a new one (with a new process generation) is started — unless
the previous start failed less than the backoff interval ago, in which case the request fails
fast with a retryable ``unavailable``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from ..backends import ModelSpec, Runtime
from ..plugins import WerkPluginManager
from ..protocol import CapabilityId, Unavailable, WerkError

__all__ = ["RuntimeManager"]

log = logging.getLogger("werk.runtimes")

BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 30.0


class RuntimeManager:
    """Starts, caches and stops runtimes through their backends' descriptors."""

    def __init__(self, pm: WerkPluginManager, *, clock: Callable[[], float] = time.monotonic):
        self._pm = pm
        self._clock = clock
        self._runtimes: dict[str, Runtime] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._failures: dict[str, tuple[int, float]] = {}
        self._retired: set[str] = set()

    def live(self) -> dict[str, Runtime]:
        """Alive runtimes by model id (a snapshot; never starts anything)."""
        return {model: rt for model, rt in self._runtimes.items() if rt.alive}

    def take_retired(self) -> set[str]:
        """Generations that ended since the last call (stopped, or found dead)."""
        for runtime in self._runtimes.values():
            if not runtime.alive:
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

    async def get(self, spec: ModelSpec) -> Runtime:
        """The live runtime for ``spec``, starting (or restarting) it when needed."""
        lock = self._locks.setdefault(spec.id, anyio.Lock())
        async with lock:
            current = self._runtimes.get(spec.id)
            if current is not None and current.alive and current.model == spec:
                return current
            if current is not None:
                await self._stop(spec.id, current)
            return await self._start(spec)

    async def _start(self, spec: ModelSpec) -> Runtime:
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
        try:
            runtime = await descriptor.start(spec)
        except WerkError:
            self._failures[spec.id] = (failures + 1, self._clock())
            raise
        except Exception as exc:
            self._failures[spec.id] = (failures + 1, self._clock())
            log.exception("starting %s for model %s failed", spec.backend, spec.id)
            raise Unavailable(
                f"backend {spec.backend!r} could not start model {spec.id!r} "
                f"({type(exc).__name__})",
                capability=CapabilityId.MODEL_RESIDENCY,
            ) from None
        self._failures.pop(spec.id, None)
        self._runtimes[spec.id] = runtime
        return runtime

    async def stop(self, model_id: str) -> bool:
        """Stop the runtime of ``model_id``; ``False`` when none was running."""
        lock = self._locks.setdefault(model_id, anyio.Lock())
        async with lock:
            runtime = self._runtimes.get(model_id)
            if runtime is None:
                return False
            await self._stop(model_id, runtime)
            return True

    async def _stop(self, model_id: str, runtime: Runtime) -> None:
        self._runtimes.pop(model_id, None)
        self._retired.add(runtime.generation)
        descriptor = self._pm.backends.get(runtime.backend)
        if descriptor is None or descriptor.stop is None:
            return
        try:
            await descriptor.stop(runtime)
        except Exception:
            log.exception("stopping %s runtime for %s failed", runtime.backend, model_id)
        runtime.alive = False

    async def aclose(self) -> None:
        """Stop every runtime (server shutdown)."""
        for model_id in list(self._runtimes):
            await self.stop(model_id)
