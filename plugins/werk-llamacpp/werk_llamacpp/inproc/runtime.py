"""Starting, proving and stopping a ``llamacpp-inproc`` runtime, and what it reports.

**Start**: the model options are checked, the GGUF header and tensor directory are parsed by
Werk (``gguf.GGUFReader``, the parse the memory estimate uses) so a damaged or foreign file is
refused with a typed error before llama.cpp's loader sees it, then the library is imported and
the model loaded in a worker thread. Then the functional probes run on this very runtime:

* the state probe (:func:`werk.probe_state_hooks`: prefill, snapshot, erase, restore, and both
  decodes equal; a snapshot cut in half refused) gates every state and prefill/decode row,
  ``runtime.state.tier.ram`` included (a live state is an object in this process: the host
  keeps it for ``retention: memory``);
* the prefix probe: a state of a shorter prompt, restored from its bytes and continued with a
  longer one, must restore exactly the shared tokens, evaluate only the rest (llama.cpp's
  counters) and continue like a cold prefill of the longer prompt; it gates
  ``runtime.state.restore.prefix``.

**Envelope**: ``executable`` is the SHA-256 of the loaded ``libllama`` (the llama.cpp build),
``args`` the context settings a state depends on (``n_ctx``, ``n_batch``, KV types), and
``cache_layout`` names llama-cpp-python's version and the state layout. A state from another
model, library or context is therefore ``409 incompatible_state`` before any hook runs.
``runtime.state.restore.cross_restart`` is ``experimental`` only when this generation restored
the canary an earlier ``werk serve`` process of the same lineage left and continued it
identically (``canary.py``); otherwise ``unavailable`` with the reason.

**Stop** waits for the lane (a running generation ends first), then frees the context; ``pid``
is ``None``: no process serves this runtime alone.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from werk import (
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DecodeCall,
    InvalidRequest,
    ModelSpec,
    PrefillCall,
    Runtime,
    RuntimeRequirement,
    StateProbe,
    Unavailable,
    probe_state_hooks,
)

from ..args import model_file
from ..requirement import MemoryRequirement, requirement_for
from . import states
from .canary import prove_cross_restart
from .engine import Engine
from .lane import Lane
from .library import LibraryFacts, load_library, locate_library
from .options import InprocOptions, parse_inproc_options

__all__ = ["BACKEND", "InprocHandle", "capabilities", "runtime_requirement", "start", "stop"]

BACKEND = "llamacpp-inproc"
STATE_ROWS = (
    (CapabilityId.STATE_PREFIX_CACHE, ["prefill"]),
    (CapabilityId.STATE_PERSISTENCE, ["prefill", "snapshot"]),
    (CapabilityId.STATE_RESTORE, ["restore"]),
    (CapabilityId.STATE_TIER_DISK, ["snapshot", "restore"]),
    (CapabilityId.STATE_TIER_RAM, ["prefill"]),
    (CapabilityId.PD_PREFILL, ["prefill"]),
    (CapabilityId.PD_DECODE, ["decode"]),
    (CapabilityId.PD_HANDOFF, ["prefill", "decode"]),
)
PREFIX_PROBE = ("The prefix probe reads this sentence first.", " Then it reads this one too.")


@dataclass(eq=False)
class InprocHandle:
    """A runtime's engine, lane and what its probes found."""

    engine: Engine
    lane: Lane
    library: LibraryFacts
    options: InprocOptions
    probe: StateProbe | None = None
    prefix: StateProbe | None = None
    cross_restart: StateProbe | None = None
    notes: list[str] = field(default_factory=list)


async def start(model: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: load the model in this process and prove its states.

    :raises werk.InvalidRequest: bad options, or not a GGUF Werk can read.
    :raises werk.Unavailable: llama-cpp-python is missing, or llama.cpp refused the model.
    """
    options = parse_inproc_options(model.options)
    path = model_file(model)
    # parses the header and tensor directory: refuses a damaged or foreign file
    need = await anyio.to_thread.run_sync(_need, path, options)
    _, library = await anyio.to_thread.run_sync(load_library)
    sessions = options.session_bytes(need.kv_cache_bytes)
    engine = await anyio.to_thread.run_sync(Engine.load, path, options, sessions)
    handle = InprocHandle(engine=engine, lane=Lane(engine), library=library, options=options)
    runtime = Runtime(
        backend=BACKEND,
        model=model,
        generation="g_" + secrets.token_hex(8),
        handle=handle,
        executable=library.library,
        args=options.runtime_args(),
        cache_layout=f"llama-cpp-python {library.version}; llama_state_seq bytes of one sequence",
    )
    handle.probe = await probe_state_hooks(
        runtime,
        prefill=states.prefill,
        decode=states.decode,
        snapshot=states.snapshot,
        restore=states.restore,
        erase=states.erase,
    )
    if handle.probe.passed:
        handle.prefix = await probe_prefix(runtime)
        handle.cross_restart = await prove_cross_restart(runtime)
    await handle.lane.run(_forget, engine)  # the probes' tokens are no one's session
    return runtime


def _forget(engine: Engine) -> None:
    engine.clear()
    engine.sessions.clear()


async def stop(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: after the running call, free the context."""
    runtime.alive = False
    handle: InprocHandle = runtime.handle
    await handle.lane.run(handle.engine.close)


async def probe_prefix(runtime: Runtime) -> StateProbe:
    """The prefix step (see the module docstring); never raises for a failed step."""

    def result(passed: bool, reason: str) -> StateProbe:
        return StateProbe(passed=passed, reason=reason, generation=runtime.generation)

    short, rest = PREFIX_PROBE
    step = "prefill of the shorter prompt"
    try:
        kept = await states.prefill(runtime, PrefillCall(prompt=short, keep=True))
        step = "snapshot"
        exported = await states.snapshot(runtime, kept.state)
        await states.erase(runtime, kept.state)
        step = "restore"
        restored = await states.restore(runtime, exported)
        await states.erase(runtime, restored)
        step = "continued prefill"
        longer = short + rest
        continued = await states.prefill(
            runtime, PrefillCall(prompt=longer, keep=True, reuse_from=restored, continued=True)
        )
        after = await states.decode(runtime, DecodeCall(state=continued.state, max_tokens=4))
        await states.erase(runtime, continued.state)
        step = "cold prefill"
        cold = await states.prefill(runtime, PrefillCall(prompt=longer, keep=True))
        before = await states.decode(runtime, DecodeCall(state=cold.state, max_tokens=4))
    except Exception as exc:
        return result(False, f"prefix probe failed: its {step} raised {type(exc).__name__}: {exc}")
    shared = continued.restored_tokens or 0
    if not 0 < shared < continued.prompt_tokens or continued.cached_tokens != shared:
        return result(
            False,
            f"prefix probe failed: a restored prefix of {shared} tokens was reused for "
            f"{continued.cached_tokens} of {continued.prompt_tokens} prompt tokens",
        )
    if cold.cached_tokens != 0 or not before.text or after.text != before.text:
        return result(
            False,
            f"prefix probe failed: a continued prefix generated {after.text!r}, "
            f"a cold prefill {before.text!r}",
        )
    return result(
        True,
        f"prefix probe passed for generation {runtime.generation}: {shared} tokens restored, "
        f"{continued.prompt_tokens - shared} evaluated, same continuation as a cold prefill",
    )


def _need(path: Path, options: InprocOptions) -> MemoryRequirement:
    """llama.cpp's estimate for one sequence of ``ctx_size`` (``requirement.py``)."""
    return requirement_for(path, ["-c", str(options.ctx_size), "-ub", str(options.batch_size)])


async def runtime_requirement(spec: ModelSpec) -> RuntimeRequirement:
    """``BackendDescriptor.requirement``: weights, the one sequence's KV cache, compute
    buffers, and the chat-session cache's bound — all in this process's memory.

    :raises werk.InvalidRequest: bad options, or a GGUF header without what the estimate needs.
    """
    options = parse_inproc_options(spec.options)
    need = await anyio.to_thread.run_sync(_need, model_file(spec), options)
    parts = [
        ("weights", need.weights_bytes),
        ("kv cache", need.kv_cache_bytes),
        ("compute", need.compute_bytes),
    ]
    sessions = options.session_bytes(need.kv_cache_bytes)
    if sessions:
        parts.append(("session cache", sessions))
    return RuntimeRequirement(nbytes=sum(n for _, n in parts), parts=tuple(parts))


def _row(
    cap: CapabilityId, status: CapabilityStatus, reason: str, ops: list[str] | None = None
) -> CapabilityReport:
    return CapabilityReport(id=cap, status=status, reason=reason, operations=ops or [])


def _residency(context: CapabilityContext) -> CapabilityReport:
    runtime = context.runtime
    if runtime is not None and runtime.alive and isinstance(runtime.handle, InprocHandle):
        return _row(
            CapabilityId.MODEL_RESIDENCY,
            CapabilityStatus.SUPPORTED,
            f"loaded in the werk serve process (generation {runtime.generation})",
        )
    try:
        source = locate_library()
        if context.model is not None:
            parse_inproc_options(context.model.options)
    except (Unavailable, InvalidRequest) as exc:
        return _row(CapabilityId.MODEL_RESIDENCY, CapabilityStatus.UNAVAILABLE, exc.message)
    if context.model is None:
        return _row(
            CapabilityId.MODEL_RESIDENCY,
            CapabilityStatus.UNAVAILABLE,
            "no GGUF model is configured for llamacpp-inproc",
        )
    return _row(
        CapabilityId.MODEL_RESIDENCY,
        CapabilityStatus.SUPPORTED,
        f"llama-cpp-python from {source} loads the model into werk serve on first use",
    )


def _probe_status(context: CapabilityContext, which: str) -> tuple[CapabilityStatus, str]:
    runtime = context.runtime
    if runtime is None or not runtime.alive or not isinstance(runtime.handle, InprocHandle):
        return (
            CapabilityStatus.UNAVAILABLE,
            "the model is not loaded; its first request loads it and runs the functional probe",
        )
    probe = {
        "state": runtime.handle.probe,
        "prefix": runtime.handle.prefix,
        "cross-restart": runtime.handle.cross_restart,
    }[which]
    if probe is None or probe.generation != runtime.generation:
        return CapabilityStatus.UNAVAILABLE, f"the {which} probe has not run for this runtime"
    if not probe.passed:
        failed = f"state probe failed: {probe.reason}" if which == "state" else probe.reason
        return CapabilityStatus.UNAVAILABLE, failed
    if which == "state":
        return (
            CapabilityStatus.EXPERIMENTAL,
            f"state probe passed for generation {runtime.generation}",
        )
    return CapabilityStatus.EXPERIMENTAL, probe.reason


def capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    rows = [_residency(context)]
    status, reason = _probe_status(context, "state")
    rows += [_row(cap, status, reason, ops) for cap, ops in STATE_ROWS]
    for cap, which in (
        (CapabilityId.STATE_RESTORE_PREFIX, "prefix"),
        (CapabilityId.STATE_RESTORE_CROSS_RESTART, "cross-restart"),
    ):
        step_status, step_reason = _probe_status(context, which)
        if status is not CapabilityStatus.EXPERIMENTAL:
            step_status, step_reason = status, reason
        rows.append(_row(cap, step_status, step_reason, ["restore"]))
    return rows
