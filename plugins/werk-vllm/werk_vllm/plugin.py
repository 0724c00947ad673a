"""Werk hook implementations for vLLM: a Werk-started local server and a remote endpoint.

``werk backends install vllm`` builds vLLM's environment (:mod:`.environment`),
``werk models create-demo --kind vllm`` writes a tiny model with it, and backend ``vllm`` runs
one supervised vLLM OpenAI server per model (:mod:`.process`) and relays ``/v1`` to it through
the host's :func:`werk.openai_upstream`. The remote endpoint (``vllm-remote``) is not
built yet: its rows say so.

Rows (the seed's local-vLLM column, as far as it is built):

* ``runtime.model_residency``: ``supported`` while a Werk-started server is alive, else
  ``unavailable`` (the reason says whether vLLM is installed).
* ``runtime.state.prefix_cache``: ``unavailable`` without a live server; with one, from its
  effective arguments: ``externally_managed`` (operation ``automatic_reuse``) with
  ``--enable-prefix-caching`` and not ``--no-enable-prefix-caching``, ``unsupported`` with only
  the disable flag, ``metadata_only`` when neither is explicit (vLLM's own default decides).

The plugin implements no state, prefill/decode or expert hook, so the host reports those rows
``unsupported`` (backend contract 1.1).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DemoModel,
    EnvironmentSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    Unavailable,
    hookimpl,
    openai_upstream,
)

from .environment import DEMO, INSTALL_HINT, environment_spec, managed_python
from .process import DISABLE_APC, ENABLE_APC, VllmHandle, check_alive, start_runtime, stop_runtime

LOCAL = "vllm"
REMOTE = "vllm-remote"
ROUTES = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=LOCAL,
            formats=("safetensors", "hf"),
            description="a Werk-started local vLLM OpenAI server",
            start=start_runtime,
            stop=stop_runtime,
        )
    )
    register(
        BackendDescriptor(
            name=REMOTE,
            formats=("openai-endpoint",),
            description="a separately operated vLLM OpenAI endpoint",
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install vllm``: vLLM's CPU build here, the CUDA build with a GPU."""
    return [environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind vllm``: a tiny Llama written by vLLM's environment."""
    return [DEMO]


def _live(context: CapabilityContext) -> Runtime | None:
    runtime = context.runtime
    if runtime is None or not isinstance(runtime.handle, VllmHandle):
        return None
    return runtime if check_alive(runtime) else None


def _no_process() -> str:
    if os.environ.get("WERK_VLLM_PYTHON"):
        return "no active Werk-started vLLM process (WERK_VLLM_PYTHON is set)"
    if managed_python() is None:
        return f"vLLM is not installed; {INSTALL_HINT}"
    return "no active Werk-started vLLM process; the first request for the model starts one"


def _prefix_cache(runtime: Runtime) -> CapabilityReport:
    args = runtime.args
    enabled, disabled = ENABLE_APC in args, DISABLE_APC in args
    if enabled and not disabled:
        return CapabilityReport(
            id=CapabilityId.STATE_PREFIX_CACHE,
            status=CapabilityStatus.EXTERNALLY_MANAGED,
            operations=["automatic_reuse"],
            reason="vLLM's automatic prefix caching (--enable-prefix-caching) owns the reuse; "
            "Werk cannot name, persist, move or hand off its entries",
        )
    if disabled and not enabled:
        return CapabilityReport(
            id=CapabilityId.STATE_PREFIX_CACHE,
            status=CapabilityStatus.UNSUPPORTED,
            reason="the vLLM process runs with --no-enable-prefix-caching",
        )
    return CapabilityReport(
        id=CapabilityId.STATE_PREFIX_CACHE,
        status=CapabilityStatus.METADATA_ONLY,
        reason="the vLLM process's arguments neither enable nor disable prefix caching "
        "explicitly; vLLM's default decides",
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend == REMOTE:
        why = "no remote vLLM endpoint is configured (remote vLLM is not built yet)"
        return [
            CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=why
            ),
            CapabilityReport(
                id=CapabilityId.STATE_PREFIX_CACHE, status=CapabilityStatus.UNAVAILABLE, reason=why
            ),
        ]
    live = _live(context)
    if live is None:
        why = _no_process()
        return [
            CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=why
            ),
            CapabilityReport(
                id=CapabilityId.STATE_PREFIX_CACHE,
                status=CapabilityStatus.UNAVAILABLE,
                reason=f"{why}; automatic prefix caching is backend-owned",
            ),
        ]
    return [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load", "unload"],
        ),
        _prefix_cache(live),
    ]


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Relay ``/v1`` chat and text completions to the runtime's vLLM server."""
    handle = runtime.handle
    if not isinstance(handle, VllmHandle):
        return None  # vllm-remote: not built yet; the host answers unsupported
    if not check_alive(runtime):
        raise Unavailable(
            f"the vLLM process of model {runtime.model.id!r} exited; the next request starts "
            "a new one",
            retryable=True,
        )
    body = dict(call.body)
    body["model"] = runtime.model.id
    if call.cache_salt is not None:
        # Werk's per-principal salt always wins over one the client sent: vLLM shares cached
        # prefix blocks between requests with equal salts, i.e. between API keys otherwise.
        body["cache_salt"] = call.cache_salt
    return await openai_upstream(
        handle.http, ROUTES[call.route], body, stream=call.stream, what="vLLM"
    )
