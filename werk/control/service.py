"""The local control service: Werk Protocol 1.0 implemented over the plugins and the store.

It resolves the caller's view (principal), applies policy defaults, gates capabilities, keeps the
catalog, the volatile index and the handoff registry, and delegates to the owning backend
through the hooks. It never interprets a backend's state. Blocking file work runs in worker
threads so the event loop keeps serving.
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from .._version import PROTOCOL_VERSION, __version__
from ..backends import (
    CapabilityContext,
    ExpertMove,
    ExpertMoveOutcome,
    ExpertReport,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    OpenAIRoute,
    Operation,
    Runtime,
)
from ..capabilities import capability_contexts, host_capabilities
from ..experts.engine import ExpertEngine
from ..memory.manager import MemoryManager
from ..memory.telemetry import process_tree_rss
from ..models import ModelManifest
from ..plugins import WerkPluginManager
from ..protocol import (
    BackendError,
    CapabilitiesResponse,
    CapabilityId,
    CapabilityReport,
    DecodeRequest,
    DecodeResponse,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    InfoResponse,
    InvalidRequest,
    JobError,
    JobRecord,
    JobStatus,
    MemoryResponse,
    ModelInfo,
    ModelList,
    ModelRef,
    NotFound,
    PinRequest,
    PinResult,
    PrefillRequest,
    PrefillResponse,
    PruneRequest,
    PruneResult,
    ResidencyRequest,
    ResidencyResult,
    ResourceExhausted,
    ServerInfo,
    StateList,
    StateStatus,
    StateSummary,
    Tier,
    TierRequest,
    TierResult,
    Unavailable,
    Unsupported,
    WerkError,
    rfc3339,
)
from ..protocol.residency import RuntimeInfo, RuntimeList, parse_keep_alive
from ..protocol.stats import StatsResponse
from ..state.catalog import StateCatalog
from ..state.envelope import Envelope
from ..state.handoffs import HandoffRegistry
from ..state.jobs import JobStore
from ..state.principals import cache_salt
from .accounting import ReuseAccounting
from .context import ServiceConfig
from .figures import Histogram, ServiceFigures
from .gates import gate
from .interface import StateQuery, WerkControl
from .prefill import PrefillFlow
from .runtimes import KeepAlive, RuntimeManager, Use
from .states import StateViews
from .volatile import VolatileStates

__all__ = ["LocalControlService", "ServiceConfig"]

log = logging.getLogger("werk.control")


JOB_KINDS: tuple[OpenAIRoute, ...] = ("audio.speech", "images.generations")
_QueuedJob = tuple[str, str, OpenAIRoute, dict[str, Any]]
"""(job id, principal, route, validated body)."""
JOB_QUEUE_SIZE = 256
IDLE_CHECK_SECONDS = 1.0
"""The idle unloader looks at least this often (and at each runtime's deadline, and whenever a
use ends, so ``keep_alive: 0`` unloads right after the request)."""


def _job_artifact(kind: OpenAIRoute, reply: OpenAIReply) -> tuple[bytes, str]:
    """The file a finished job keeps: the speech audio, or the (one) image as PNG."""
    if kind == "audio.speech":
        if reply.content is None or reply.media_type is None:
            raise BackendError("the backend answered speech without audio")
        return reply.content, reply.media_type
    data = (reply.body or {}).get("data") or [{}]
    encoded = data[0].get("b64_json") if isinstance(data[0], dict) else None
    if not isinstance(encoded, str):
        raise BackendError("the backend answered the image request without an image")
    return base64.b64decode(encoded), "image/png"


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
        self._specs = {s.id: self._with_defaults(s) for s in map(_spec_of, config.models)}
        unknown = sorted({s.backend for s in self._specs.values()} - set(pm.backends))
        if unknown:
            raise Unsupported(f"no loaded plugin provides backend(s): {', '.join(unknown)}")
        self.catalog = StateCatalog(config.home, clock=clock)
        self.volatile = VolatileStates(clock=clock)
        self.handoffs = HandoffRegistry(config.namespace_key, clock=clock)
        self.accounting = ReuseAccounting(clock)
        self.commit_latency = Histogram()
        self.restore_latency = Histogram()
        self.memory_manager = memory if memory is not None else MemoryManager()
        for name, descriptor in pm.backends.items():
            self.memory_manager.set_participant(name, descriptor.requirement is not None)
        self.runtimes = RuntimeManager(
            pm,
            wall=clock,
            keep_alive=config.keep_alive_seconds,
            memory=self.memory_manager,
            handoff_generations=self.handoffs.generations_in_use,
            pinned_generations=self.volatile.pinned_generations,
            cache_release=config.model_cache_release,
        )
        self.job_store = JobStore(config.home, clock=clock)
        self._job_send: MemoryObjectSendStream[_QueuedJob] | None = None  # while run_jobs runs
        self._engines: dict[str, ExpertEngine] = {}
        self._cache_salts: dict[str, str] = {}  # principal → its salt (one HMAC, not per request)
        self.states = StateViews(self)
        self.flow = PrefillFlow(self)
        self._preload: tuple[anyio.CancelScope, anyio.Event] | None = None
        """The running (or finished) preload's scope and its end."""
        self._closing = False

    def _with_defaults(self, spec: ModelSpec) -> ModelSpec:
        """The spec a backend starts: with this server's persistence defaults, if it has any."""
        defaults = self.config.persistence_defaults
        return spec if defaults is None else msgspec.structs.replace(spec, persistence=defaults)

    # -- shared helpers ----------------------------------------------------------------------

    def spec(self, model: str) -> ModelSpec:
        try:
            return self._specs[model]
        except KeyError:
            raise NotFound(f"model {model!r} is not served here") from None

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
        for generation in self.runtimes.take_retired():
            self.handoffs.drop_generation(generation)

    # -- discovery ---------------------------------------------------------------------------

    async def info(self) -> InfoResponse:
        return InfoResponse(
            protocol=PROTOCOL_VERSION,
            werk_version=__version__,
            server=ServerInfo(started_at=self._started_at, auth=self.config.auth_mode),
            plugins=self.pm.plugin_rows(),
            models=[ModelRef(id=s.id, backend=s.backend) for s in self._specs.values()],
            persistence_defaults=self.config.persistence_defaults,
        )

    async def capabilities(self, *, model: str | None = None) -> CapabilitiesResponse:
        self.forget_dead_generations()
        contexts = capability_contexts(
            self.pm, list(self._specs.values()), self.runtimes.live(), model=model
        )
        rows = await anyio.to_thread.run_sync(host_capabilities)
        uncovered = await self.runtimes.unbounded(list(self._specs.values()))
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
            ]
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
        for spec in self._specs.values():
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
                for s in self._specs.values()
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

    # -- experts -----------------------------------------------------------------------------

    async def _observed_engine(
        self, model: str, *, allow_experimental: bool
    ) -> tuple[Use, ExpertEngine]:
        """Gate ``runtime.experts.residency``, then refresh the model's engine from the
        backend's own observations (the engine never discovers experts itself). The runtime
        is held busy until the returned :class:`Use` is released."""
        spec = self.spec(model)
        runtime = self.runtimes.live().get(model)
        gate(
            await self.rows_for(spec, runtime),
            CapabilityId.EXPERTS_RESIDENCY,
            allow_experimental=allow_experimental,
        )
        use = await self.runtimes.use(spec)
        try:
            report: ExpertReport = await self.pm.call_operation(
                Operation.OBSERVE_EXPERTS, use.runtime
            )
        except BaseException:
            use.release()
            raise
        engine = self._engines.setdefault(model, ExpertEngine(model))
        engine.observe(report.experts, complete=report.complete)
        for expert_id in report.accesses:
            engine.record_access(expert_id)
        return use, engine

    async def experts(self, principal: str, model: str) -> ExpertList:
        # Reading observations changes nothing; an experimental capability may be inspected.
        use, engine = await self._observed_engine(model, allow_experimental=True)
        use.release()
        return engine.to_protocol()

    async def expert_action(
        self,
        principal: str,
        model: str,
        action: Literal["prefetch", "evict"],
        request: ExpertActionRequest,
    ) -> ExpertActionResult:
        """Plan (dry run, the default) or apply a bounded expert move. Both need the opt-in:
        the engine claims the experts before the adapter moves them and changes its metadata
        only for the experts the adapter reports moved."""
        use, engine = await self._observed_engine(
            model, allow_experimental=request.allow_experimental
        )
        with use:
            return await self._move_experts(engine, use.runtime, action, request)

    async def _move_experts(
        self,
        engine: ExpertEngine,
        runtime: Runtime,
        action: Literal["prefetch", "evict"],
        request: ExpertActionRequest,
    ) -> ExpertActionResult:
        if action == "prefetch":
            plan = engine.plan_prefetch(request.experts, target=request.target)
        else:
            plan = engine.plan_evict(request.experts, target=request.target)
        if request.dry_run or not plan.moves:
            return engine.result(plan, dry_run=request.dry_run)
        claim = engine.claim(plan.expert_ids, target=request.target)
        try:
            outcome: ExpertMoveOutcome = await self.pm.call_operation(
                Operation.MOVE_EXPERTS,
                runtime,
                move=ExpertMove(expert_ids=claim.expert_ids, target=request.target.value),
            )
        except BaseException:
            engine.abort(claim)
            raise
        completion = engine.complete(claim, outcome.moved)
        return engine.result(plan, dry_run=False, completion=completion)

    # -- jobs --------------------------------------------------------------------------------

    async def job(self, principal: str, job_id: str) -> JobRecord:
        return await anyio.to_thread.run_sync(self.job_store.get, principal, job_id)

    async def jobs(self, principal: str) -> list[JobRecord]:
        return await anyio.to_thread.run_sync(self.job_store.records, principal)

    async def submit_job(
        self, principal: str, kind: OpenAIRoute, body: dict[str, Any]
    ) -> JobRecord:
        if kind not in JOB_KINDS:
            raise InvalidRequest(f"{kind} cannot run as a job (jobs: {', '.join(JOB_KINDS)})")
        model = body.get("model")
        spec = self.spec(model if isinstance(model, str) else "")
        if kind not in self.pm.backends[spec.backend].routes:
            raise Unsupported(
                f"model {spec.id!r} (backend {spec.backend!r}) does not serve "
                f"/v1/{kind.replace('.', '/')}"
            )
        if kind == "images.generations" and body.get("n", 1) != 1:
            raise InvalidRequest("an image job makes one image: use 'n': 1")
        if kind == "images.generations":  # a job's image is always a stored output
            body = {**body, "response_format": "b64_json"}
        queue = self._job_send
        if queue is None:
            raise Unavailable("this server runs no job queue", retryable=False)
        record = await anyio.to_thread.run_sync(self.job_store.create, principal, kind, body)
        try:
            queue.send_nowait((record.id, principal, kind, body))
        except anyio.WouldBlock:
            await anyio.to_thread.run_sync(
                functools.partial(
                    self.job_store.update,
                    record.id,
                    status=JobStatus.FAILED,
                    error=JobError(code="resource_exhausted", message="the job queue is full"),
                )
            )
            raise ResourceExhausted("the job queue is full; retry later") from None
        return record

    async def cancel_job(self, principal: str, job_id: str) -> JobRecord:
        return await anyio.to_thread.run_sync(self.job_store.cancel, principal, job_id)

    async def job_output(self, principal: str, output_id: str) -> tuple[bytes, str]:
        return await anyio.to_thread.run_sync(self.job_store.output, principal, output_id)

    async def run_jobs(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        send, receive = anyio.create_memory_object_stream[_QueuedJob](JOB_QUEUE_SIZE)
        async with send, receive:
            interrupted = await anyio.to_thread.run_sync(self.job_store.recover)
            if interrupted:
                log.warning("%d unfinished job(s) of an earlier server failed", len(interrupted))
            self._job_send = send
            task_status.started()
            try:
                async for job_id, principal, kind, body in receive:
                    await self._run_job(job_id, principal, kind, body)
            finally:
                self._job_send = None

    async def _run_job(
        self, job_id: str, principal: str, kind: OpenAIRoute, body: dict[str, Any]
    ) -> None:
        update = self.job_store.update
        record = await anyio.to_thread.run_sync(self.job_store.get, principal, job_id)
        if record.status is not JobStatus.QUEUED:
            return  # cancelled while queued

        async def phase(status: JobStatus) -> None:
            await anyio.to_thread.run_sync(functools.partial(update, job_id, status=status))

        await phase(JobStatus.LOADING)
        changes: dict[str, Any]
        try:
            reply = await self.openai_request(
                principal, kind, body, started=lambda: phase(JobStatus.RUNNING)
            )
            data, content_type = _job_artifact(kind, reply)
            current = await anyio.to_thread.run_sync(self.job_store.get, principal, job_id)
            if current.cancel_requested:
                changes = {"status": JobStatus.CANCELLED}
            else:
                await phase(JobStatus.ENCODING)
                output = await anyio.to_thread.run_sync(
                    self.job_store.save_output, job_id, data, content_type
                )
                changes = {"status": JobStatus.COMPLETED, "output": output}
        except WerkError as exc:
            changes = {
                "status": JobStatus.FAILED,
                "error": JobError(code=exc.code.value, message=exc.message),
            }
        except Exception:
            log.exception("job %s failed", job_id)
            changes = {
                "status": JobStatus.FAILED,
                "error": JobError(code="internal", message="the job failed inside Werk"),
            }
        await anyio.to_thread.run_sync(functools.partial(update, job_id, **changes))

    # -- OpenAI /v1 --------------------------------------------------------------------------

    async def openai_models(self) -> dict[str, Any]:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": s.id, "object": "model", "created": created, "owned_by": s.backend}
                for s in self._specs.values()
            ],
        }

    async def openai_request(
        self,
        principal: str,
        route: OpenAIRoute,
        body: dict[str, Any],
        *,
        started: Callable[[], Awaitable[None]] | None = None,
    ) -> OpenAIReply:
        """One ``/v1`` request; ``started`` is awaited once the model's runtime is up, before
        the backend is called (a job's ``loading`` → ``running``)."""
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise InvalidRequest("'stream' must be a boolean")
        keep_alive = None
        if "keep_alive" in body:  # Werk's (Ollama's) field: never forwarded to the backend
            body = dict(body)
            keep_alive = KeepAlive(parse_keep_alive(body.pop("keep_alive")))
        spec = self.spec(model)
        descriptor = self.pm.backends[spec.backend]
        if route not in descriptor.routes:
            raise Unsupported(
                f"model {model!r} (backend {spec.backend!r}) does not serve "
                f"/v1/{route.replace('.', '/')}"
            )
        use = await self.runtimes.use(spec)
        try:
            if started is not None:
                await started()
            call = OpenAICall(
                route=route,
                body=body,
                stream=stream,
                cache_salt=self._cache_salt(principal),
            )
            reply: OpenAIReply = await self.pm.call_operation(
                Operation.OPENAI, use.runtime, call=call
            )
        except BaseException:
            use.release(keep_alive)
            raise
        if reply.stream is not None:  # busy until the stream is closed
            return OpenAIReply(
                stream=_ContainedStream(
                    reply.stream, spec.backend, on_close=lambda: use.release(keep_alive)
                )
            )
        use.release(keep_alive)
        if route in ("images.generations", "images.edits") and body.get("response_format") == "url":
            return await self._images_by_url(principal, route, body, reply)
        return reply

    def _cache_salt(self, principal: str) -> str:
        salt = self._cache_salts.get(principal)
        if salt is None:  # principals are bounded by the configured API keys
            salt = self._cache_salts[principal] = cache_salt(self.config.namespace_key, principal)
        return salt

    async def _images_by_url(
        self, principal: str, route: OpenAIRoute, body: dict[str, Any], reply: OpenAIReply
    ) -> OpenAIReply:
        """``response_format: url``: each image is kept as a finished job's output (private to
        the caller, listed in ``/v1/jobs``, bounded by the job retention, purged by
        ``werk cache``) and answered as ``{"url": "/v1/outputs/…"}``."""
        items = (reply.body or {}).get("data") or []
        urls = []
        for item in items:
            encoded = item.get("b64_json") if isinstance(item, dict) else None
            if not isinstance(encoded, str):
                raise BackendError("the backend answered the image request without an image")
            record = await anyio.to_thread.run_sync(
                functools.partial(
                    self.job_store.create_finished,
                    principal,
                    route,
                    {k: v for k, v in body.items() if k != "image_b64"},
                    base64.b64decode(encoded),
                    "image/png",
                )
            )
            assert record.output is not None
            urls.append({"url": record.output.url})
        return OpenAIReply(body={**(reply.body or {}), "data": urls})

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


class _ContainedStream:
    """A backend's streamed ``/v1`` reply, its failures contained like ``call_operation``'s.

    The stream is consumed after ``call_operation`` returned, so a plain exception raised by the
    plugin mid-stream would otherwise surface as ``internal`` (a Werk bug). It becomes
    ``backend_error`` with Werk's own summary; the plugin's text goes only to the server log.
    :meth:`aclose` closes the plugin's iterator exactly once; the HTTP layer calls it when the
    reply ends, fails or the client goes away, so plugins can rely on their ``aclose()``.
    """

    def __init__(
        self,
        stream: AsyncIterator[bytes],
        backend: str,
        *,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._stream = stream
        self._backend = backend
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> _ContainedStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._stream.__anext__()
        except (StopAsyncIteration, WerkError):
            raise
        except Exception:
            log.exception("the streamed reply of backend %r failed", self._backend)
            raise BackendError(
                f"backend {self._backend!r} failed while streaming its reply"
            ) from None

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._stream, "aclose", None)
            if aclose is not None:
                await aclose()
        except Exception:
            log.exception("closing the streamed reply of backend %r failed", self._backend)
        finally:
            if self._on_close is not None:
                self._on_close()
