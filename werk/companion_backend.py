"""A backend served by one companion worker per Werk process, shared by its runtimes.

:class:`CompanionBackend` is what such a backend's plugin keeps (media, Transformers, ONNX
Runtime GenAI do): the worker — started by the first runtime that needs it, started again after
it ended — the runtimes that use it (all marked dead when it ends), a runtime's stop (the
worker unloads the model while other runtimes use it, and ends with the last), and the
``runtime.model_residency`` row in the words every such backend uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from .backends import CapabilityContext, Runtime
from .companion import CompanionWorker
from .environments import FoundPython
from .protocol import CapabilityId, CapabilityReport, CapabilityStatus, WerkError

__all__ = ["CompanionBackend"]

W = TypeVar("W", bound=CompanionWorker)


class CompanionBackend(Generic[W]):
    """The shared worker of one backend and the runtimes that use it.

    :param kind: the worker's kind (``media``, ``transformers``…), as in its messages.
    :param start: starts a worker (e.g. ``spawn`` then :meth:`CompanionWorker.handshake`).
    :param locate: the worker's python (raises ``werk.Unavailable`` naming the install command
        when there is none), for the row before a worker runs.
    :param entry: what its LRU holds, for the row (``model``, ``pipeline``).
    :param capacity_setting: the variable that sizes that LRU, named in the row.
    :param held: what the entries' bytes are (``parameters and buffers``, ``ONNX files``).
    :param note: a clause added to the row of a live worker (``; …``), from the worker.
    """

    def __init__(
        self,
        kind: str,
        start: Callable[[], Awaitable[W]],
        locate: Callable[[], FoundPython],
        *,
        entry: str,
        capacity_setting: str,
        held: str = "parameters and buffers",
        note: Callable[[W], str] = lambda worker: "",
    ) -> None:
        self.kind = kind
        self.worker: W | None = None
        self.runtimes: list[Runtime] = []
        self._start = start
        self._locate = locate
        self._entry = entry
        self._capacity_setting = capacity_setting
        self._held = held
        self._note = note

    async def running(self) -> W:
        """The live worker, started if there is none (one that died is reaped first)."""
        worker = self.worker
        if worker is not None and worker.alive():
            return worker
        if worker is not None:  # it died between requests: reap it, release its directory
            await worker.stop()
        worker = self.worker = await self._start()

        def ended() -> None:
            for runtime in list(self.runtimes):
                if getattr(runtime.handle, "worker", None) is worker:
                    runtime.alive = False

        worker.on_end(ended)
        return worker

    def attach(self, runtime: Runtime) -> Runtime:
        """Track a runtime whose ``handle.worker`` is this backend's worker."""
        self.runtimes.append(runtime)
        return runtime

    async def detach(self, runtime: Runtime, unload: dict[str, Any]) -> None:
        """A runtime's stop: ``unload`` it from the worker while other runtimes use the
        worker; the last one ends the worker."""
        runtime.alive = False
        self.runtimes = [r for r in self.runtimes if r is not runtime]
        worker = getattr(runtime.handle, "worker", None)
        if not isinstance(worker, CompanionWorker) or not worker.alive():
            return
        if any(getattr(r.handle, "worker", None) is worker for r in self.runtimes):
            with contextlib.suppress(WerkError):  # it ended: its runtimes are marked dead
                await worker.request("unload", unload)
            return
        await worker.stop()
        if self.worker is worker:
            self.worker = None

    def residency(
        self, context: CapabilityContext, loaded: Callable[[Runtime], str]
    ) -> CapabilityReport:
        """The ``runtime.model_residency`` row: ``supported`` while the worker lives (whether
        this runtime's entry — ``loaded(runtime)``, a path in the worker's ``resident`` list —
        is loaded, the LRU's use and bytes); before it starts, ``supported`` with only ``load``
        when a python is found, else ``unavailable`` with the reason naming the install
        command."""
        worker = self.worker
        if worker is None or not worker.alive():
            return self._before_start()
        return self._live(worker, context, loaded)

    def _live(
        self, worker: W, context: CapabilityContext, loaded: Callable[[Runtime], str]
    ) -> CapabilityReport:
        resident = [str(entry.get("path")) for entry in worker.resident]
        where = ""
        runtime = context.runtime
        if runtime is not None and getattr(runtime.handle, "worker", None) is worker:
            here = loaded(runtime) in resident
            where = f"its {self._entry} is " + ("resident; " if here else "not loaded now; ")
        held = sum(int(entry.get("bytes") or 0) for entry in worker.resident)
        return CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load", "unload"],
            reason=f"{where}the {self.kind} worker (pid {worker.process.pid}) keeps "
            f"{len(resident)} of at most {worker.capacity} {self._entry}(s) "
            f"({self._capacity_setting}), {held} bytes of {self._held}{self._note(worker)}",
        )

    def _before_start(self) -> CapabilityReport:
        try:
            found = self._locate()
        except WerkError as exc:
            return CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY,
                status=CapabilityStatus.UNAVAILABLE,
                reason=exc.message,
            )
        return CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load"],
            reason=f"no {self.kind} worker is running (its python from {found.source}); loading "
            f"a model (POST /werk/v1/models/ID/load) or the first {self.kind} request starts one",
        )
