"""Werk hook implementations for the llama.cpp backend (``llamacpp``).

The backend runs one Werk-managed ``llama-server`` child per model runtime (``process.py``),
proxies ``/v1`` to it (``proxy.py``) and implements named states through the child's ``/slots``
API (``states.py``, gated by the functional probe in ``probe.py``). Persistent terminal chats
(``werk run``/``werk chat --persistence`` on the local route) get native KV snapshots of their
slot (``chat_snapshots.py``, through ``werk_chat_native_cache``).

Capability rows are the seed's llama.cpp columns, computed from what is true now:

* ``runtime.model_residency``: ``supported`` while a live child serves the model, or when one
  can be started (an executable is located, its inspection advertises the essential flags and
  the model's options are valid); otherwise ``unavailable`` with the reason.
* state and prefill/decode rows: ``experimental`` only while the runtime is alive *and* its
  handle's functional probe passed for that very process generation; otherwise
  ``unavailable`` with the probe's reason (not run, failed, no live process, process exited).
* ``runtime.state.restore.cross_restart``: ``experimental`` only when this generation's probe
  also restored a slot file an earlier generation of the same lineage saved (a canary) and
  reproduced its greedy output (``probe.py``, ``canary.py``); otherwise ``unavailable`` with the
  reason (no earlier generation, a corrupt or failing canary, the probe not run or failed).
* ``runtime.state.restore.prefix``: ``experimental`` only when this generation's probe also
  continued its restored state with a longer prompt, reusing exactly the restored prefix and
  reproducing a cold run (``probe.py``, prefix step); otherwise ``unavailable`` with the reason.
* ``runtime.state.tier.ram|vram`` and ``runtime.experts.residency``: the host reports them
  ``unsupported`` (no tier hook exists; this plugin implements no expert hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from werk import (
    BackendDescriptor,
    BackendState,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DecodeCall,
    DecodeOutcome,
    DemoModel,
    InvalidRequest,
    NativeChatCache,
    NativeContext,
    OpenAICall,
    OpenAIReply,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    Unavailable,
    hookimpl,
)

if TYPE_CHECKING:
    from .handle import LlamaHandle


BACKEND = "llamacpp"

_PROBE_GATED = (
    (CapabilityId.STATE_PREFIX_CACHE, ["prefill"]),
    (CapabilityId.STATE_PERSISTENCE, ["prefill", "snapshot"]),
    (CapabilityId.STATE_RESTORE, ["restore"]),
    (CapabilityId.STATE_TIER_DISK, ["snapshot", "restore"]),
    (CapabilityId.PD_PREFILL, ["prefill"]),
    (CapabilityId.PD_DECODE, ["decode"]),
    (CapabilityId.PD_HANDOFF, ["prefill", "decode"]),
)


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("gguf",),
            description="llama.cpp llama-server, one managed child process per model",
            start="werk_llamacpp.start:start_runtime",
            stop="werk_llamacpp.process:stop_runtime",
            requirement="werk_llamacpp.requirement:runtime_requirement",
            inspect="werk_llamacpp.model_facts:inspect_model",
            routes=("chat.completions", "completions", "embeddings"),
        )
    )


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind gguf`` (the default kind)."""
    from .demo_model import DEMO

    return [DEMO]


# -- capabilities ---------------------------------------------------------------------------


def _live(context: CapabilityContext) -> Runtime | None:
    from .handle import LlamaHandle
    from .process import check_alive

    runtime = context.runtime
    if runtime is None or not isinstance(runtime.handle, LlamaHandle):
        return None
    return runtime if check_alive(runtime) else None


def _residency(context: CapabilityContext) -> CapabilityReport:
    from .args import check_native_args, parse_options
    from .executable import locate_llama_server
    from .inspect import inspect_executable_sync

    def row(status: CapabilityStatus, reason: str) -> CapabilityReport:
        return CapabilityReport(id=CapabilityId.MODEL_RESIDENCY, status=status, reason=reason)

    live = _live(context)
    if live is not None:
        return row(
            CapabilityStatus.SUPPORTED,
            f"a Werk-managed llama-server process (generation {live.generation}) holds the model",
        )
    located = locate_llama_server(context.model.options if context.model is not None else None)
    if located.path is None:
        return row(
            CapabilityStatus.UNAVAILABLE, f"no llama-server executable found ({located.reason})"
        )
    if context.model is None:
        return row(CapabilityStatus.UNAVAILABLE, "no GGUF model is configured for llama.cpp")
    try:
        options = parse_options(context.model.options)
        inspection = inspect_executable_sync(located.path)
        if inspection.missing_essential:
            return row(
                CapabilityStatus.UNAVAILABLE,
                "the llama-server executable does not advertise "
                f"{', '.join(inspection.missing_essential)}",
            )
        check_native_args(options.native_args, inspection)
    except (InvalidRequest, Unavailable) as exc:
        return row(CapabilityStatus.UNAVAILABLE, exc.message)
    return row(
        CapabilityStatus.SUPPORTED,
        f"a managed llama-server ({inspection.version}) is started for this model on first use",
    )


def _state_status(context: CapabilityContext) -> tuple[CapabilityStatus, str]:
    from .handle import ProbeStatus

    if context.model is None:
        return CapabilityStatus.UNAVAILABLE, "named states need a configured GGUF model"
    runtime = context.runtime
    if runtime is None:
        return (
            CapabilityStatus.UNAVAILABLE,
            "no live llama-server process for this model; an opted-in Prefill starts one and "
            "runs the functional state probe",
        )
    if _live(context) is None:
        return (
            CapabilityStatus.UNAVAILABLE,
            f"the llama-server process of generation {runtime.generation} is not running",
        )
    handle: LlamaHandle = runtime.handle
    probe = handle.probe
    if probe.status is ProbeStatus.PASSED and handle.generation == runtime.generation:
        return (
            CapabilityStatus.EXPERIMENTAL,
            f"functional probe passed for process generation {runtime.generation}",
        )
    if probe.status is ProbeStatus.FAILED:
        return (
            CapabilityStatus.UNAVAILABLE,
            f"functional probe failed for process generation {runtime.generation}: {probe.reason}",
        )
    return (
        CapabilityStatus.UNAVAILABLE,
        f"the functional state probe has not run for process generation {runtime.generation}",
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    rows = [_residency(context)]
    status, reason = _state_status(context)
    rows += [
        CapabilityReport(id=cap, status=status, operations=ops, reason=reason)
        for cap, ops in _PROBE_GATED
    ]
    rows.append(_probe_step(context, status, reason, CapabilityId.STATE_RESTORE_CROSS_RESTART))
    rows.append(_probe_step(context, status, reason, CapabilityId.STATE_RESTORE_PREFIX))
    return rows


def _probe_step(
    context: CapabilityContext,
    state_status: CapabilityStatus,
    state_reason: str,
    row: CapabilityId,
) -> CapabilityReport:
    """``experimental`` only when this generation's probe also passed the row's own step: the
    cross-restart step (a slot file an earlier generation of the same lineage saved restored
    and replayed) or the prefix step (a restored state continued with a longer prompt)."""
    from .handle import ProbeStatus

    if state_status is not CapabilityStatus.EXPERIMENTAL or context.runtime is None:
        return CapabilityReport(id=row, status=CapabilityStatus.UNAVAILABLE, reason=state_reason)
    handle: LlamaHandle = context.runtime.handle
    step = (
        handle.cross_restart if row is CapabilityId.STATE_RESTORE_CROSS_RESTART else handle.prefix
    )
    if step.status is ProbeStatus.PASSED:
        return CapabilityReport(
            id=row, status=CapabilityStatus.EXPERIMENTAL, operations=["restore"], reason=step.reason
        )
    return CapabilityReport(id=row, status=CapabilityStatus.UNAVAILABLE, reason=step.reason)


# -- operations -----------------------------------------------------------------------------


def _require_alive(runtime: Runtime) -> None:
    """Refuse an operation on a child that exited (the host then starts a new one)."""
    from .process import check_alive

    if not check_alive(runtime):
        raise Unavailable(
            f"the llama-server process of model {runtime.model.id!r} exited; "
            "the next request starts a new one",
            retryable=True,
        )


@hookimpl
async def werk_prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    from . import states

    _require_alive(runtime)
    return await states.prefill(runtime, call)


@hookimpl
async def werk_decode(runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
    from . import states

    _require_alive(runtime)
    return await states.decode(runtime, call)


@hookimpl
async def werk_snapshot(runtime: Runtime, state: BackendState) -> BackendState:
    from . import states

    _require_alive(runtime)
    return await states.snapshot(runtime, state)


@hookimpl
async def werk_restore(runtime: Runtime, payload: BackendState) -> BackendState:
    from . import states

    _require_alive(runtime)
    return await states.restore(runtime, payload)


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    from .proxy import openai_reply

    return await openai_reply(runtime, call)


@hookimpl
async def werk_chat_native_cache(
    runtime: Runtime, context: NativeContext
) -> NativeChatCache | None:
    from . import chat_snapshots

    return await chat_snapshots.open_chat_cache(runtime, context)
