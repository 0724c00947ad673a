"""Werk hook implementations for oMLX (backend ``omlx``).

Werk starts an installed ``omlx`` CLI on demand (:mod:`.installation`, :mod:`.worker`) and
relays ``/v1`` chat and text completions to it, streamed or not, with Werk's model id and
Werk's errors (the worker's JSON errors are never forwarded). With ``werk serve --persistence``
(retention auto or disk, reuse not disabled) the worker runs oMLX's native SSD prefix cache
(4 GB) in its private directory, one worker per API key; reuse is *verified*: a request counts
as reused only when the worker reports cached prompt tokens (:mod:`.reuse`), and the answer
carries them as ``usage.prompt_tokens_details.cached_tokens``. The worker directories are in
``werk cache`` (:mod:`.cache`).

Rows, as the seed's matrix says for oMLX: ``runtime.model_residency`` ``supported`` while an
owned worker of the model runs, ``unavailable`` before it starts, after it exited, or when no
``omlx`` is installed (the reason says which); ``runtime.experts.residency`` ``unsupported``
(Werk's expert adapter for oMLX is not built) or ``unavailable`` without oMLX; the plugin
implements no state or prefill/decode hook, so the host reports those rows ``unsupported``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from werk import (
    BackendDescriptor,
    CacheEntry,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ExpertMove,
    ExpertMoveOutcome,
    ExpertObservation,
    ExpertReport,
    ExpertTier,
    OpenAICall,
    OpenAIReply,
    Runtime,
    WerkError,
    hookimpl,
)

if TYPE_CHECKING:
    from .reuse import ReuseCounter


log = logging.getLogger("werk.omlx")

BACKEND = "omlx"
PLUGIN = "werk-omlx"
ROUTES = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("mlx",),
            description="an installed oMLX CLI started on demand",
            start="werk_omlx.worker:start_runtime",
            stop="werk_omlx.worker:stop_runtime",
        )
    )


def _no_omlx() -> str | None:
    from .installation import locate

    try:
        locate()
    except WerkError as exc:
        return exc.message
    return None


def _residency(context: CapabilityContext, missing: str | None) -> CapabilityReport:
    from .worker import LIVE, OmlxHandle

    handle = context.runtime.handle if context.runtime is not None else None
    handles = [handle] if isinstance(handle, OmlxHandle) else list(LIVE)
    if context.model is not None and not isinstance(handle, OmlxHandle):
        handles = [h for h in handles if h.spec.id == context.model.id]
    running = [(h, w) for h in handles for w in h.alive_workers()]
    if running:
        described = "; ".join(
            f"pid {w.process.pid} for {h.spec.id} (prefix cache "
            f"{'on' if h.cache_on else 'off'}; {w.counter.summary()})"
            for h, w in running
        )
        return CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load", "unload"],
            reason=f"owned oMLX worker(s) running: {described}",
        )
    if missing is not None:
        why = missing
    else:
        exits = [h.last_exit for h in handles if h.last_exit]
        why = (
            f"{exits[-1]}; the next request starts a new one"
            if exits
            else "no oMLX worker is running; the first request for the model starts one"
        )
    return CapabilityReport(
        id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=why
    )


def _experts(context: CapabilityContext, missing: str | None) -> CapabilityReport:
    """``experimental`` only with the adapter active (self-check passed) for a running worker
    of the model; ``unavailable`` without oMLX, after a failed self-check or with no worker;
    ``unsupported`` for a checkpoint the adapter does not handle or without a budget."""
    from .experts import BUDGET_ENV
    from .worker import OmlxHandle

    def row(
        status: CapabilityStatus, reason: str, operations: list[str] | None = None
    ) -> CapabilityReport:
        return CapabilityReport(
            id=CapabilityId.EXPERTS_RESIDENCY, status=status, reason=reason,
            operations=operations or [],
        )  # fmt: skip

    if missing is not None:
        return row(CapabilityStatus.UNAVAILABLE, f"{missing}; expert offload needs a loaded worker")
    handle = context.runtime.handle if context.runtime is not None else None
    if not isinstance(handle, OmlxHandle):
        return row(
            CapabilityStatus.UNSUPPORTED,
            "the expert adapter is decided per model when its runtime starts: a DeepSeek MoE "
            f"checkpoint (MLX affine layout) with {BUDGET_ENV} set",
        )
    adapter = handle.experts
    if adapter is None:
        return row(CapabilityStatus.UNSUPPORTED, f"no expert adapter: {handle.experts_reason}")
    if not adapter.active:
        return row(CapabilityStatus.UNAVAILABLE, adapter.problem or "the self-check failed")
    if not handle.alive_workers():
        return row(
            CapabilityStatus.UNAVAILABLE,
            "the expert adapter passed its self-check; no oMLX worker of the model is loaded",
        )
    mib = 1024 * 1024
    return row(
        CapabilityStatus.EXPERIMENTAL,
        f"expert adapter active: {len(adapter.observe())} experts sliced from the safetensors "
        f"files, {adapter.cached_bytes() / mib:.1f} of {adapter.budget / mib:.0f} MiB cached "
        "in Werk's process (ram), the rest external",
        ["observe", "prefetch", "evict"],
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend != BACKEND:
        return []
    missing = _no_omlx()
    return [_residency(context, missing), _experts(context, missing)]


@hookimpl
async def werk_observe_experts(runtime: Runtime) -> ExpertReport | None:
    """Every expert with its tier (``ram`` cached, ``external`` on disk) and exact size; the
    worker's routing is not visible, so no accesses are reported."""
    import anyio

    from .worker import OmlxHandle

    handle = runtime.handle
    if not isinstance(handle, OmlxHandle) or handle.experts is None:
        return None
    observed = await anyio.to_thread.run_sync(handle.experts.observe)
    return ExpertReport(
        experts=[ExpertObservation(id=e, tier=ExpertTier(t), nbytes=n) for e, t, n in observed]
    )


@hookimpl
async def werk_move_experts(runtime: Runtime, move: ExpertMove) -> ExpertMoveOutcome | None:
    """Load experts into the cache (``ram``) or drop them (``external``); only real changes
    are reported moved."""
    import anyio

    from .worker import OmlxHandle

    handle = runtime.handle
    if not isinstance(handle, OmlxHandle) or handle.experts is None:
        return None
    adapter = handle.experts
    moved, failed = await anyio.to_thread.run_sync(
        adapter.move, list(move.expert_ids), str(move.target)
    )
    return ExpertMoveOutcome(moved=moved, failed=failed)


def _verified(counter: ReuseCounter) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A stream rewrite: usage chunks in OpenAI's shape, their verified reuse counted."""
    from .reuse import normalize_usage

    def rewrite(chunk: dict[str, Any]) -> dict[str, Any]:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            counter.record(normalize_usage(usage))
        return chunk

    return rewrite


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Relay ``/v1`` chat and text completions to the partition's worker."""
    from werk import RewrittenStream, openai_upstream, renamed

    from .reuse import normalize_usage
    from .worker import OmlxHandle

    handle = runtime.handle
    if not isinstance(handle, OmlxHandle) or call.route not in ROUTES:
        return None
    worker = await handle.worker(handle.partition(call.cache_salt))
    body = dict(call.body)
    body["model"] = worker.served
    reply = await openai_upstream(
        worker.http, ROUTES[call.route], body, stream=call.stream, what="oMLX", logger=log
    )
    if reply.stream is not None:  # every chunk is decoded anyway: renamed, usage counted
        rename, count = renamed(runtime.model.id), _verified(worker.counter)
        return OpenAIReply(stream=RewrittenStream(reply.stream, lambda c: count(rename(c))))
    if reply.body is not None:
        reply.body["model"] = runtime.model.id
        usage = reply.body.get("usage")
        if isinstance(usage, dict):
            worker.counter.record(normalize_usage(usage))
    return reply


@hookimpl
def werk_cache_inventory(home: Path) -> list[CacheEntry]:
    """The worker directories under ``backends/omlx/workers/`` (see :mod:`.cache`)."""
    from . import cache

    return cache.inventory(home)


@hookimpl
def werk_cache_purge(home: Path, entry_id: str) -> bool | None:
    """Remove a worker directory no worker holds (``Conflict`` while one runs)."""
    from . import cache

    return cache.purge(home, entry_id)
