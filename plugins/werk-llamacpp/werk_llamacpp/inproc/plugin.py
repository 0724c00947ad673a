"""Werk hook implementations for ``llamacpp-inproc`` (registered by its own entry point, so
the host calls these only for this backend's runtimes).

Importing this module loads neither llama-cpp-python nor the engine: each hook imports what it
needs when it is called.
"""

from __future__ import annotations

from collections.abc import Callable

from werk import (
    BackendDescriptor,
    BackendState,
    CapabilityContext,
    CapabilityReport,
    DecodeCall,
    DecodeOutcome,
    DemoModel,
    EnvironmentSpec,
    OpenAICall,
    OpenAIReply,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    Unavailable,
    hookimpl,
)

BACKEND = "llamacpp-inproc"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            # GGUF files, but never inferred from one (a .gguf stays llamacpp's by default):
            # `werk models import FILE --backend llamacpp-inproc` chooses this backend.
            formats=(),
            description="llama.cpp inside werk serve (llama-cpp-python), no child process",
            start="werk_llamacpp.inproc.runtime:start",
            stop="werk_llamacpp.inproc.runtime:stop",
            requirement="werk_llamacpp.inproc.runtime:runtime_requirement",
            inspect="werk_llamacpp.model_facts:inspect_model",
            routes=("chat.completions", "completions"),
            states_in_process=True,
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    from .library import ENVIRONMENT

    return [ENVIRONMENT]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind llamacpp-inproc``: the tiny demo GGUF, in-process."""
    from ..demo_model import create_demo

    return [
        DemoModel(
            kind=BACKEND,
            backend=BACKEND,
            description="the gguf demo file, served inside werk serve by llama-cpp-python",
            create=create_demo,
        )
    ]


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    from .runtime import capabilities

    return capabilities(context)


def _require_alive(runtime: Runtime) -> None:
    if not runtime.alive:
        raise Unavailable(
            f"the in-process model {runtime.model.id!r} was unloaded; the next request loads it",
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
    from .openai import openai_reply

    _require_alive(runtime)
    return await openai_reply(runtime, call)
