"""The local control service: Werk Protocol 1.0 implemented over the plugins and the store.

It resolves the caller's view (principal), applies policy defaults, gates capabilities, keeps the
catalog, the volatile index and the handoff registry, and delegates to the owning backend
through the hooks. It never interprets a backend's state. Blocking file work runs in worker
threads so the event loop keeps serving.

This class is the façade: discovery, runtimes and preload live here; each other concept has its
module, built with the service as its :class:`~werk.control.context.ServiceContext`: named states
(:mod:`.states`), prefill/decode (:mod:`.prefill`), experts (:mod:`.experts`), jobs
(:mod:`.jobs`) and the OpenAI ``/v1`` requests (:mod:`.openai`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec

from .._version import PROTOCOL_VERSION, __version__
from ..backends import (
    CapabilityContext,
    ModelSpec,
    OpenAIReply,
    OpenAIRoute,
    Runtime,
)
from ..capabilities import capability_contexts, host_capabilities
from ..memory.manager import MemoryManager
from ..memory.telemetry import process_tree_rss
from ..model_formats import model_root
from ..models import ModelManifest, ModelRegistry
from ..plugins import WerkPluginManager
from ..protocol import (
    CapabilitiesResponse,
    CapabilityId,
    CapabilityReport,
    ChatStateOptions,
    DecodeRequest,
    DecodeResponse,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    InfoResponse,
    JobDeleted,
    JobRecord,
    MemoryResponse,
    ModelInfo,
    ModelList,
    ModelRef,
    PinRequest,
    PinResult,
    PrefillRequest,
    PrefillResponse,
    PruneRequest,
    PruneResult,
    ResidencyRequest,
    ResidencyResult,
    ServerInfo,
    StateList,
    StateStatus,
    StateSummary,
    Tier,
    TierRequest,
    TierResult,
    Unsupported,
    WerkError,
    rfc3339,
)
from ..protocol.residency import LoadingRuntime, RuntimeInfo, RuntimeList
from ..protocol.stats import StatsResponse
from ..state.catalog import StateCatalog
from ..state.envelope import Envelope
from ..state.handoffs import HandoffRegistry
from ..state.jobs import JobStore
from .accounting import ReuseAccounting
from .chat_states import PersistedChats
from .context import ServiceConfig
from .experts import ExpertControl
from .figures import Histogram, ServiceFigures
from .gates import gate
from .interface import ImageModel, StateQuery, WerkControl
from .jobs import JobQueue
from .openai import OpenAIRequests
from .prefill import PrefillFlow
from .runtimes import RuntimeManager
from .served import ServedModels
from .states import StateViews
from .volatile import VolatileStates

__all__ = ["LocalControlService", "ServiceConfig"]

log = logging.getLogger("werk.control")


IDLE_CHECK_SECONDS = 1.0
"""The idle unloader looks at least this often (and at each runtime's deadline, and whenever a
use ends, so ``keep_alive: 0`` unloads right after the request)."""


def _spec_of(model: ModelManifest | ModelSpec) -> ModelSpec:
    return model.spec() if isinstance(model, ModelManifest) else model


class LocalControlService(WerkControl):
    """The in-process implementation of :class:`WerkControl`."""

    def __init__(
        self,
        pm: WerkPluginManager,
        config: ServiceConfig,
        *,
        clock: Callable[[], float] = time.time,
        memory: MemoryManager | None = None,
    ) -> None:
        self.pm = pm
        self.config = config
        self.clock = clock
        self._started_at = rfc3339(clock())
        fixed = [_spec_of(m) for m in config.models]
        unknown = sorted({s.backend for s in fixed} - set(pm.backends))
        if unknown:
            raise Unsupported(f"no loaded plugin provides backend(s): {', '.join(unknown)}")
        self._models = ServedModels(
            fixed,
            registry=ModelRegistry(config.home) if config.serve_imported else None,
            prepare=self._with_defaults,
            backends=pm.backends,
        )
        self.catalog = StateCatalog(config.home, clock=clock)
        self.memory_manager = memory if memory is not None else MemoryManager()
        self.volatile = VolatileStates(clock=clock, memory=self.memory_manager)
        self.handoffs = HandoffRegistry(config.namespace_key, clock=clock)
        self.accounting = ReuseAccounting(clock)
        self.commit_latency = Histogram()
        self.restore_latency = Histogram()
        for name, descriptor in pm.backends.items():
            self.memory_manager.set_participant(name, descriptor.requirement is not None)
        self.runtimes = RuntimeManager(
            pm,
            wall=clock,
            keep_alive=config.keep_alive_seconds,
            memory=self.memory_manager,
            handoff_generations=self.handoffs.generations_in_use,
            pinned_generations=self.volatile.pinned_generations,
            relief_states=self.volatile,
            cache_release=config.model_cache_release,
        )
        self.job_store = JobStore(config.home, clock=clock)
        self.states = StateViews(self)
        self.flow = PrefillFlow(self)
        self.chats = PersistedChats(self, self.flow)
        self.experts_control = ExpertControl(self)
        self.openai = OpenAIRequests(self)
        self.job_queue = JobQueue(self, self.openai.request)
        self._preload: tuple[anyio.CancelScope, anyio.Event] | None = None
        """The running (or finished) preload's scope and its end."""
        self._closing = False

    def _with_defaults(self, spec: ModelSpec) -> ModelSpec:
        """The spec a backend starts: with this server's persistence defaults, if it has any."""
        defaults = self.config.persistence_defaults
        return spec if defaults is None else msgspec.structs.replace(spec, persistence=defaults)

    # -- shared helpers ----------------------------------------------------------------------

    def spec(self, model: str) -> ModelSpec:
        return self._models.get(model)

    def served(self) -> list[ModelSpec]:
        return self._models.all()

    async def rows_for(self, spec: ModelSpec, runtime: Runtime | None) -> list[CapabilityReport]:
        """The capability rows of one model now (after any probe the runtime has run).

        The plugin's discovery runs in a worker thread, bounded (never on the event loop)."""
        return await self.pm.capabilities_bounded(
            CapabilityContext(backend=spec.backend, model=spec, runtime=runtime)
        )

    def envelope_for(self, runtime: Runtime, principal: str) -> Envelope:
        record = self.pm.owner_of(runtime.backend)
        return Envelope(
            adapter=record.name,
            adapter_version=record.version or "",
            backend=runtime.backend,
            executable=runtime.executable,
            model_identity=runtime.model.identity,
            runtime_args=tuple(runtime.args),
            cache_layout=runtime.cache_layout,
            generation=runtime.generation,
            principal=principal,
        )

    def live_envelope(self, model: str, principal: str) -> Envelope | None:
        runtime = self.runtimes.live().get(model)
        return self.envelope_for(runtime, principal) if runtime is not None else None

    def forget_dead_generations(self) -> None:
        """Drop volatile states and handoffs of process generations that ended."""
        live = self.runtimes.generations()
        self.volatile.drop_generations(live)
        self.flow.live_kept.drop_generations(live)
        for generation in self.runtimes.take_retired():
            self.handoffs.drop_generation(generation)

    # -- discovery ---------------------------------------------------------------------------

    async def info(self) -> InfoResponse:
        return InfoResponse(
            protocol=PROTOCOL_VERSION,
            werk_version=__version__,
            server=ServerInfo(started_at=self._started_at, auth=self.config.auth_mode),
            plugins=self.pm.plugin_rows(),
            models=[ModelRef(id=s.id, backend=s.backend) for s in self.served()],
            persistence_defaults=self.config.persistence_defaults,
        )

    async def capabilities(self, *, model: str | None = None) -> CapabilitiesResponse:
        self.forget_dead_generations()
        contexts = capability_contexts(self.pm, self.served(), self.runtimes.live(), model=model)
        rows = await anyio.to_thread.run_sync(host_capabilities)
        uncovered = await self.runtimes.unbounded(self.served())
        rows.append(self.memory_manager.reservations_capability(uncovered))
        answers: list[list[CapabilityReport]] = [[] for _ in contexts]

        async def ask(index: int, context: CapabilityContext) -> None:
            answers[index] = await self.pm.capabilities_bounded(context)

        async with anyio.create_task_group() as tg:
            for index, context in enumerate(contexts):
                tg.start_soon(ask, index, context)
        rows += [row for answer in answers for row in answer]
        return CapabilitiesResponse(protocol=PROTOCOL_VERSION, capabilities=rows)

    async def memory(self) -> MemoryResponse:
        return await anyio.to_thread.run_sync(self.memory_manager.snapshot)

    # -- loaded runtimes and keep-alive ------------------------------------------------------

    async def stats(self, principal: str) -> StatsResponse:
        return self.accounting.stats(principal)

    async def figures(self) -> ServiceFigures:
        self.forget_dead_generations()
        events = self.runtimes.event_counts()
        volatile = self.volatile.counts()
        loaded: dict[str, int] = {}
        for runtime in self.runtimes.live().values():
            loaded[runtime.backend] = loaded.get(runtime.backend, 0) + 1

        def gather() -> tuple[dict[tuple[Tier, StateStatus], int], MemoryResponse]:
            return self.catalog.counts(), self.memory_manager.snapshot()

        stored, memory = await anyio.to_thread.run_sync(gather)
        states = {(t.value, s.value): n for (t, s), n in stored.items()}
        for (tier, status), n in volatile.items():
            states[(tier, status)] = states.get((tier, status), 0) + n
        return ServiceFigures(
            runtime_events=events,
            states=states,
            handoffs=self.handoffs.event_counts(),
            reuse=self.accounting.totals(),
            commit_seconds=self.commit_latency.snapshot(),
            restore_seconds=self.restore_latency.snapshot(),
            memory=memory,
            loaded_runtimes=loaded,
        )

    async def runtimes_listing(self) -> RuntimeList:
        entries = self.runtimes.entries()

        def observed() -> list[int | None]:
            return [
                None if e.runtime.pid is None else process_tree_rss(e.runtime.pid) for e in entries
            ]

        rss = await anyio.to_thread.run_sync(observed)
        now = self.clock()
        return RuntimeList(
            runtimes=[
                RuntimeInfo(
                    model=e.runtime.model.id,
                    backend=e.runtime.backend,
                    generation=e.runtime.generation,
                    pid=e.runtime.pid,
                    started_at=rfc3339(e.started_at),
                    age_seconds=max(0, int(now - e.started_at)),
                    busy=e.busy,
                    idle_until=None if e.idle_until is None else rfc3339(e.idle_until),
                    keep_alive_seconds=e.keep_alive,
                    reserved_bytes=e.reserved,
                    observed_bytes=bytes_,
                    preparation=e.runtime.preparation,
                )
                for e, bytes_ in zip(entries, rss, strict=True)
            ],
            loading=[
                LoadingRuntime(
                    model=e.model,
                    backend=e.backend,
                    phase=e.phase,
                    started_at=rfc3339(e.since),
                    elapsed_seconds=max(0, int(now - e.since)),
                    waiting=e.waiting,
                )
                for e in self.runtimes.loading()
            ],
        )

    async def preload(self) -> None:
        """Start the configured models' runtimes now, in order, instead of on their first
        requests (``werk serve``, when ``config.preload``). Requests for a model that is still
        starting wait for it. A model that does not start or does not fit next to those already
        loaded is logged and left to its first request. :meth:`aclose` cancels a preload that is
        still running (its half-started child is stopped) before it stops the runtimes."""
        if not self.config.preload or self._preload is not None or self._closing:
            return
        scope, done = anyio.CancelScope(), anyio.Event()
        self._preload = (scope, done)
        try:
            with scope:
                await self._preload_each()
        finally:
            done.set()

    async def _preload_each(self) -> None:
        if self.runtimes.keep_alive == 0:
            log.info("no model preloaded: --keep-alive 0 would unload it at once")
            return
        for spec in self.served():
            if not self.runtimes.can_start(spec.backend):
                continue
            try:
                await self.runtimes.get(spec, preload=True)
            except WerkError as exc:
                log.warning(
                    "model %s was not preloaded (it starts on its first request): %s",
                    spec.id,
                    exc.message,
                )
            except Exception:
                log.exception("preloading model %s failed; it starts on its first request", spec.id)
            else:
                log.info("model %s preloaded", spec.id)

    async def run_idle_unloads(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        while True:
            due = self.runtimes.seconds_to_next_unload()
            delay = IDLE_CHECK_SECONDS if due is None else min(IDLE_CHECK_SECONDS, due)
            await self.runtimes.wait_for_release(delay)
            try:
                protected = self.handoffs.generations_in_use() | self.volatile.pinned_generations()
                if await self.runtimes.unload_idle(protected):
                    self.forget_dead_generations()
            except Exception:  # a bug here must not take the server down; it is logged
                log.exception("the idle unloader failed; it tries again")
                await anyio.sleep(IDLE_CHECK_SECONDS)

    # -- models ------------------------------------------------------------------------------

    async def models(self) -> ModelList:
        live = self.runtimes.live()
        return ModelList(
            models=[
                ModelInfo(
                    id=s.id,
                    backend=s.backend,
                    identity=s.identity,
                    resident=(s.id in live) if self.runtimes.can_start(s.backend) else None,
                )
                for s in self.served()
            ]
        )

    async def set_residency(
        self, model: str, request: ResidencyRequest, *, resident: bool
    ) -> ResidencyResult:
        spec = self.spec(model)
        runtime = self.runtimes.live().get(model)
        rows = await self.rows_for(spec, runtime)
        gate(rows, CapabilityId.MODEL_RESIDENCY, allow_experimental=False)
        if request.dry_run:
            return ResidencyResult(model=model, resident=runtime is not None)
        if resident:
            await self.runtimes.get(spec)
        else:
            await self.runtimes.stop(model)
            self.forget_dead_generations()
        return ResidencyResult(model=model, resident=model in self.runtimes.live())

    # -- states ------------------------------------------------------------------------------

    async def list_states(self, principal: str, query: StateQuery) -> StateList:
        return await self.states.listing(principal, query)

    async def inspect_state(self, principal: str, state_id: str) -> StateSummary:
        return await self.states.inspect(principal, state_id)

    async def prune_states(self, principal: str, request: PruneRequest) -> PruneResult:
        return await self.states.prune(principal, request)

    async def pin_state(self, principal: str, state_id: str, request: PinRequest) -> PinResult:
        return await self.states.pin(principal, state_id, request)

    async def tier_state(self, principal: str, state_id: str, request: TierRequest) -> TierResult:
        return await self.states.tier(principal, state_id, request)

    # -- prefill / decode --------------------------------------------------------------------

    async def prefill(self, principal: str, request: PrefillRequest) -> PrefillResponse:
        return await self.flow.prefill(principal, request)

    async def decode(self, principal: str, request: DecodeRequest) -> DecodeResponse:
        return await self.flow.decode(principal, request)

    # -- experts, jobs, OpenAI /v1: one module each ---------------------------------------

    async def experts(self, principal: str, model: str) -> ExpertList:
        return await self.experts_control.experts(model)

    async def expert_action(
        self,
        principal: str,
        model: str,
        action: Literal["prefetch", "evict"],
        request: ExpertActionRequest,
    ) -> ExpertActionResult:
        return await self.experts_control.expert_action(model, action, request)

    async def job(self, principal: str, job_id: str) -> JobRecord:
        return await self.job_queue.get(principal, job_id)

    async def jobs(self, principal: str) -> list[JobRecord]:
        return await self.job_queue.listing(principal)

    async def submit_job(
        self, principal: str, kind: OpenAIRoute, body: dict[str, Any]
    ) -> JobRecord:
        return await self.job_queue.submit(principal, kind, body)

    async def cancel_job(self, principal: str, job_id: str) -> JobRecord | JobDeleted:
        return await self.job_queue.cancel(principal, job_id)

    async def job_output(self, principal: str, output_id: str) -> tuple[bytes, str]:
        return await self.job_queue.output(principal, output_id)

    async def run_jobs(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        await self.job_queue.run(task_status=task_status)

    async def openai_models(self) -> dict[str, Any]:
        return await self.openai.models()

    async def image_models(self) -> list[ImageModel]:
        out = []
        for spec in sorted(self.served(), key=lambda s: s.id):
            descriptor = self.pm.backends.get(spec.backend)
            root = model_root(spec.files)
            if descriptor is None or "images.generations" not in descriptor.routes or root is None:
                continue
            if (root / "model_index.json").is_file():  # a Diffusers pipeline
                out.append(ImageModel(id=spec.id, identity=spec.identity, directory=str(root)))
        return out

    async def speech_models(self) -> list[str]:
        images = {m.id for m in await self.image_models()}
        return sorted(
            spec.id
            for spec in self.served()
            if spec.id not in images
            and (descriptor := self.pm.backends.get(spec.backend)) is not None
            and "audio.speech" in descriptor.routes
        )

    async def openai_request(
        self,
        principal: str,
        route: OpenAIRoute,
        body: dict[str, Any],
        *,
        started: Callable[[], Awaitable[None]] | None = None,
    ) -> OpenAIReply:
        return await self.openai.request(principal, route, body, started=started)

    async def persisted_chat(
        self,
        principal: str,
        body: dict[str, Any],
        options: ChatStateOptions,
        *,
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        return await self.chats.complete(principal, body, options, on_text=on_text)

    # -- lifecycle ---------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every runtime, after cancelling a preload that is still running (and waiting
        until it has ended, so that no start completes afterwards). Idempotent."""
        self._closing = True
        if self._preload is not None:
            scope, done = self._preload
            scope.cancel()
            await done.wait()
        await self.runtimes.aclose()
