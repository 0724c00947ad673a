"""Werk hook implementations for backend ``transformers``: chat and text completions with
Hugging Face Transformers in a companion worker.

``werk backends install transformers`` builds the worker's environment (:mod:`.environment`),
``werk models create-demo --kind transformers`` writes a tiny Llama with it, and the backend
serves ``/v1/chat/completions`` and ``/v1/completions`` (streamed and not) from one worker
process per Werk process (:mod:`.worker`, protocol in ``_worker.py``) that keeps an LRU of
loaded models and generates one request at a time.

Rows: ``runtime.model_residency`` is ``supported`` while the worker lives (the reason says
whether this model is loaded now, how many of at most how many models the LRU keeps and their
bytes), and before it starts when an environment is found (a load starts one);
``unavailable`` when no environment is (the reason names the install command). The cache is
generation-local — no prompt or KV state outlives a request — so the plugin implements no state,
prefill/decode or expert hook and the host reports those rows ``unsupported``.
"""

from __future__ import annotations

import contextlib
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
    DemoModel,
    EnvironmentSpec,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    RuntimeEnded,
    WerkError,
    generation_args,
    generation_reply,
    hookimpl,
)

from .environment import locate

if TYPE_CHECKING:
    from .worker import TransformersWorker

BACKEND = "transformers"


@dataclass(eq=False)
class TransformersHandle:
    """A model's runtime: the shared worker, the model's directory and what its probe said."""

    worker: TransformersWorker
    path: Path
    architecture: str
    context_length: int
    chat_template: bool


class _Shared:
    """The worker of this Werk process and the runtimes that use it."""

    worker: TransformersWorker | None = None
    runtimes: list[Runtime] = []


def _model_dir(spec: ModelSpec) -> Path:
    """The top-most directory holding a ``config.json``."""
    configs = sorted((p for p in spec.files if p.name == "config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise InvalidRequest(f"model {spec.id!r} has no config.json: not a Transformers model")
    return configs[0].parent


async def _worker() -> TransformersWorker:
    from .worker import TransformersWorker

    worker = _Shared.worker
    if worker is not None and worker.alive():
        return worker
    if worker is not None:  # it died between requests: reap it, release its directory
        await worker.stop()
    worker = _Shared.worker = await TransformersWorker.start(locate())

    def ended() -> None:
        for runtime in list(_Shared.runtimes):
            if isinstance(runtime.handle, TransformersHandle) and runtime.handle.worker is worker:
                runtime.alive = False

    worker.on_end(ended)
    return worker


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: the worker (started if needed) checks that the model
    generates text, then loads it (into its LRU)."""
    path = _model_dir(spec)
    worker = await _worker()
    probe = await worker.request("probe-model", {"path": str(path)})
    await worker.request("load", {"path": str(path)})
    runtime = Runtime(
        backend=BACKEND,
        model=spec,
        generation=worker.generation,
        handle=TransformersHandle(
            worker=worker,
            path=path,
            architecture=str(probe["architecture"]),
            context_length=int(probe["context_length"]),
            chat_template=bool(probe["chat_template"]),
        ),
    )
    _Shared.runtimes.append(runtime)
    return runtime


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: drop the model; the last runtime ends the worker."""
    runtime.alive = False
    _Shared.runtimes = [r for r in _Shared.runtimes if r is not runtime]
    handle = runtime.handle
    if not isinstance(handle, TransformersHandle) or not handle.worker.alive():
        return
    worker = handle.worker
    if any(getattr(r.handle, "worker", None) is worker for r in _Shared.runtimes):
        with contextlib.suppress(WerkError):  # the worker ended: its runtimes are marked dead
            await worker.request("unload", {"path": str(handle.path)})
        return
    await worker.stop()
    if _Shared.worker is worker:
        _Shared.worker = None


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("hf", "transformers"),
            description="text generation with Hugging Face Transformers in a companion worker",
            start=start_runtime,
            stop=stop_runtime,
            routes=("chat.completions", "completions"),
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install transformers``: torch (CPU build here) and Transformers."""
    from .environment import environment_spec

    return [environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind transformers``: a tiny random Llama."""
    from .demos import DEMOS

    return list(DEMOS)


def _residency(context: CapabilityContext) -> CapabilityReport:
    worker = _Shared.worker
    if worker is None or not worker.alive():
        try:
            found = locate()
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
            reason=f"no transformers worker is running (its python from {found.source}); "
            "loading a model (POST /werk/v1/models/ID/load) or its first request starts one",
        )
    resident = [str(entry.get("path")) for entry in worker.resident]
    where = ""
    runtime = context.runtime
    if runtime is not None and isinstance(runtime.handle, TransformersHandle):
        loaded = str(runtime.handle.path) in resident
        where = "this model is loaded; " if loaded else "this model is not loaded now; "
    held = sum(int(entry.get("bytes") or 0) for entry in worker.resident)
    return CapabilityReport(
        id=CapabilityId.MODEL_RESIDENCY,
        status=CapabilityStatus.SUPPORTED,
        operations=["load", "unload"],
        reason=f"{where}the transformers worker (pid {worker.process.pid}) keeps "
        f"{len(resident)} of at most {worker.capacity} model(s) "
        f"(WERK_TRANSFORMERS_MODEL_CACHE_SIZE), {held} bytes of parameters and buffers; the "
        "KV cache lives for one generation",
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend != BACKEND:
        return []
    return [_residency(context)]


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Chat and text completions through the worker."""
    handle = runtime.handle
    if not isinstance(handle, TransformersHandle):
        return None
    args = generation_args(call, BACKEND) | {"path": str(handle.path)}
    if "messages" in args and not handle.chat_template:
        raise InvalidRequest(
            f"model {runtime.model.id!r} has no chat template; use /v1/completions"
        )
    if not handle.worker.alive():
        raise RuntimeEnded("the transformers worker ended before this request reached it")
    return await generation_reply(call, runtime.model.id, handle.worker.streaming("execute", args))
