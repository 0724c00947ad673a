"""Werk hook implementations for backends ``onnx-genai`` and ``onnx-runner``.

``onnx-genai`` serves ``/v1`` chat and text completions (streamed and not) from one ONNX
Runtime GenAI companion worker per Werk process (:mod:`.worker`, ``_worker.py``): an LRU of
loaded models (``WERK_ONNX_GENAI_MODEL_CACHE_SIZE``, default 1), a new generator and prompt
state per request, one generation at a time. Its ``runtime.model_residency`` row is
``supported`` while the worker lives (and before, with only ``load``, when the environment is
found), ``unavailable`` without the environment.

``onnx-runner`` starts a configured opaque runner for each request (``werk.RunnerModel``: the
runner contract) — the model's ``runner`` option (a JSON list of arguments, or a command line
split like a shell would, never run by one), else the bundled reference runner (``_runner.py``:
ONNX Runtime GenAI in the onnx environment). Nothing stays resident: its
``runtime.model_residency`` row is ``unsupported`` (the runner exposes no validated residency
protocol). The model's ``runner_timeout`` option bounds each run (seconds, default 600);
``WERK_ONNX_RUNNER_CONCURRENCY`` runners run at once (default 1; the others wait their turn).

Neither keeps a prompt or KV state across requests: the state, prefill/decode and expert rows
are the host's ``unsupported``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    CompanionBackend,
    DemoModel,
    EnvironmentSpec,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    RunnerModel,
    Runtime,
    RuntimeEnded,
    WerkError,
    generation_args,
    generation_reply,
    hookimpl,
)

from .environment import locate

if TYPE_CHECKING:
    from .worker import OnnxWorker

GENAI, RUNNER = "onnx-genai", "onnx-runner"
RUNNER_SCRIPT = Path(__file__).with_name("_runner.py")
CONCURRENCY_ENV = "WERK_ONNX_RUNNER_CONCURRENCY"


@dataclass(eq=False)
class GenaiHandle:
    """An onnx-genai model's runtime: the shared worker and the model's folder."""

    worker: OnnxWorker
    path: Path
    context_length: int


async def _start_worker() -> OnnxWorker:
    from .worker import OnnxWorker

    return await OnnxWorker.start(locate())


SHARED: CompanionBackend[OnnxWorker] = CompanionBackend(
    GENAI,
    _start_worker,
    locate,
    entry="model",
    capacity_setting="WERK_ONNX_GENAI_MODEL_CACHE_SIZE",
    held="ONNX files",
    note=lambda worker: "; each request gets a new generator",
)
"""The onnx-genai worker of this Werk process and the runtimes that use it."""


def _model_path(spec: ModelSpec) -> Path:
    """The model's folder (the files' common directory), or its one file."""
    if len(spec.files) == 1:
        return spec.files[0]
    return Path(os.path.commonpath([str(f) for f in spec.files]))


async def start_genai(spec: ModelSpec) -> Runtime:
    """``onnx-genai`` start: the worker checks the folder and loads the model (its LRU)."""
    path = _model_path(spec)
    if not (path / "genai_config.json").is_file():
        raise InvalidRequest(
            f"model {spec.id!r} is not an ONNX Runtime GenAI folder (no genai_config.json)"
        )
    worker = await SHARED.running()
    probe = await worker.request("probe-model", {"path": str(path)})
    await worker.request("load", {"path": str(path)})
    runtime = Runtime(
        backend=GENAI,
        model=spec,
        generation=worker.generation,
        handle=GenaiHandle(worker, path, int(probe["context_length"])),
    )
    return SHARED.attach(runtime)


async def stop_genai(runtime: Runtime) -> None:
    """``onnx-genai`` stop: drop the model; the last runtime ends the worker."""
    await SHARED.detach(runtime, {"path": str(getattr(runtime.handle, "path", ""))})


def _reference_runner() -> list[str]:
    return [str(locate().python), str(RUNNER_SCRIPT)]


async def start_runner(spec: ModelSpec) -> Runtime:
    """``onnx-runner`` start: nothing runs yet; the runner's command and options are checked."""
    model = RunnerModel.of(
        spec, kind=RUNNER, default=_reference_runner, concurrency_setting=CONCURRENCY_ENV
    )
    return Runtime(
        backend=RUNNER,
        model=spec,
        generation="runner_" + secrets.token_hex(8),  # nothing runs: a name per start
        handle=model,
    )


async def stop_runner(runtime: Runtime) -> None:
    runtime.alive = False


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=GENAI,
            formats=("onnx-genai",),
            description="ONNX Runtime GenAI text generation in a companion worker",
            start=start_genai,
            stop=stop_genai,
            routes=("chat.completions", "completions"),
        )
    )
    register(
        BackendDescriptor(
            name=RUNNER,
            formats=("onnx-genai",),
            description="an external runner started per request (Werk's runner contract)",
            start=start_runner,
            stop=stop_runner,
            routes=("chat.completions", "completions"),
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install onnx``: ONNX Runtime GenAI and its model builder."""
    from .environment import environment_spec

    return [environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind onnx``."""
    from .demos import DEMOS

    return list(DEMOS)


def _runner_residency(context: CapabilityContext) -> CapabilityReport:
    custom = context.model is not None and "runner" in context.model.options
    if not custom:
        try:
            locate()
        except WerkError as exc:
            return CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY,
                status=CapabilityStatus.UNAVAILABLE,
                reason=f"the reference runner needs ONNX Runtime GenAI: {exc.message} (or give "
                "the model a 'runner' option)",
            )
    return CapabilityReport(
        id=CapabilityId.MODEL_RESIDENCY,
        status=CapabilityStatus.UNSUPPORTED,
        reason="the runner is started for each request and exits after it; it exposes no "
        "validated residency protocol, so nothing stays loaded",
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend == GENAI:
        return [SHARED.residency(context, lambda r: str(getattr(r.handle, "path", "")))]
    if context.backend == RUNNER:
        return [_runner_residency(context)]
    return []


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Chat and text completions: through the worker (onnx-genai) or a runner (onnx-runner)."""
    handle = runtime.handle
    if isinstance(handle, GenaiHandle):
        args = generation_args(call, GENAI) | {"path": str(handle.path)}
        if not handle.worker.alive():
            raise RuntimeEnded("the onnx-genai worker ended before this request reached it")
        generation = handle.worker.streaming("execute", args)
        return await generation_reply(call, runtime.model.id, generation)
    if isinstance(handle, RunnerModel):
        args = generation_args(call, RUNNER)
        return await generation_reply(call, runtime.model.id, handle.run(args))
    return None
