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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityReport,
    CompanionBackend,
    DemoModel,
    EnvironmentSpec,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    RuntimeEnded,
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


async def _start_worker() -> TransformersWorker:
    from .worker import TransformersWorker

    return await TransformersWorker.start(locate())


SHARED: CompanionBackend[TransformersWorker] = CompanionBackend(
    BACKEND,
    _start_worker,
    locate,
    entry="model",
    capacity_setting="WERK_TRANSFORMERS_MODEL_CACHE_SIZE",
    note=lambda worker: "; the KV cache lives for one generation",
)
"""The worker of this Werk process and the runtimes that use it."""


def _model_dir(spec: ModelSpec) -> Path:
    """The top-most directory holding a ``config.json``."""
    configs = sorted((p for p in spec.files if p.name == "config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise InvalidRequest(f"model {spec.id!r} has no config.json: not a Transformers model")
    return configs[0].parent


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: the worker (started if needed) checks that the model
    generates text, then loads it (into its LRU)."""
    path = _model_dir(spec)
    worker = await SHARED.running()
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
    return SHARED.attach(runtime)


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: drop the model; the last runtime ends the worker."""
    path = getattr(runtime.handle, "path", "")
    await SHARED.detach(runtime, {"path": str(path)})


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


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend != BACKEND:
        return []
    return [SHARED.residency(context, lambda runtime: str(getattr(runtime.handle, "path", "")))]


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
