"""Werk hook implementations for vLLM: a Werk-started local server and a remote endpoint.

``werk backends install vllm`` builds vLLM's environment (:mod:`.environment`),
``werk models create-demo --kind vllm`` writes a tiny model with it, backend ``vllm`` runs
one supervised vLLM OpenAI server per model (:mod:`.process`), backend ``vllm-remote`` is a
client for a separately operated endpoint (:mod:`.remote`); both relay ``/v1`` through the
host's :func:`werk.openai_upstream`, adding a per-principal ``cache_salt``.

Rows (the seed's local- and remote-vLLM columns):

* ``runtime.model_residency``: local: ``supported`` while the model's Werk-started server is
  alive, else ``unavailable`` (the reason says whether and how to install vLLM); remote:
  ``externally_managed`` while the endpoint answers ``/health``, else ``unavailable``.
* ``runtime.state.prefix_cache`` is about every active vLLM (:func:`prefix_cache_row`):
  ``unavailable`` with none; ``externally_managed`` (operation ``automatic_reuse``) only when
  all active ones are Werk-started local processes whose effective arguments contain
  ``--enable-prefix-caching`` and not ``--no-enable-prefix-caching``; ``unsupported`` when every
  one has only the disable flag; ``metadata_only`` for a remote, mixed or ambiguous set.

The plugin implements no state, prefill/decode or expert hook, so the host reports those rows
``unsupported`` (backend contract 1.1).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

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
    WerkError,
    hookimpl,
)

if TYPE_CHECKING:
    from .process import (
        VllmHandle,
    )


log = logging.getLogger("werk.vllm")

LOCAL = "vllm"
REMOTE = "vllm-remote"
ROUTES = {
    "chat.completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=LOCAL,
            formats=("safetensors", "hf"),
            description="a Werk-started local vLLM OpenAI server",
            start="werk_vllm.process:start_runtime",
            stop="werk_vllm.process:stop_runtime",
            routes=("chat.completions", "completions", "embeddings"),
        )
    )
    register(
        BackendDescriptor(
            name=REMOTE,
            formats=("openai-endpoint",),
            description="a separately operated vLLM OpenAI endpoint (WERK_VLLM_HOST/PORT)",
            start="werk_vllm.remote:start_remote",
            stop="werk_vllm.remote:stop_remote",
            routes=("chat.completions", "completions", "embeddings"),
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install vllm``: vLLM's CPU build here, the CUDA build with a GPU."""
    from .environment import environment_spec

    return [environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind vllm``: a tiny Llama written by vLLM's environment."""
    from .environment import DEMO

    return [DEMO]


def _no_local_process() -> str:
    """Why no local vLLM is active: not installed (naming the install command) or not started."""
    from .installation import locate

    try:
        installation = locate()
    except WerkError as exc:
        return exc.message
    return (
        f"no active Werk-started vLLM process (vLLM from {installation.source}); the first "
        "request for the model starts one"
    )


def _remote_state() -> tuple[bool, str]:
    """(the configured endpoint answers now, why not)."""
    from .remote import configured, endpoint_answers

    try:
        endpoint = configured()
    except WerkError as exc:
        return False, exc.message
    if endpoint is None:
        return False, "no remote vLLM endpoint is configured (WERK_VLLM_HOST, WERK_VLLM_PORT)"
    if not endpoint_answers(endpoint):
        return False, f"the remote vLLM at {endpoint.base_url} does not answer /health"
    return True, ""


def prefix_cache_row(
    local_args: list[tuple[str, ...]], remote_active: bool, salted: bool, why_none: str
) -> CapabilityReport:
    """The seed's rule over every active vLLM: ``local_args`` are the effective arguments of
    the live Werk-started processes, ``salted`` whether all of them accept ``cache_salt``."""
    from .process import DISABLE_APC, ENABLE_APC

    row_id = CapabilityId.STATE_PREFIX_CACHE
    if not local_args and not remote_active:
        return CapabilityReport(
            id=row_id,
            status=CapabilityStatus.UNAVAILABLE,
            reason=f"{why_none}; automatic prefix caching is backend-owned",
        )
    if remote_active:
        return CapabilityReport(
            id=row_id,
            status=CapabilityStatus.METADATA_ONLY,
            reason="a remote vLLM is active: its prefix cache is configured and owned by the "
            "endpoint, and Werk reports it as metadata only",
        )
    enabled = [ENABLE_APC in args and DISABLE_APC not in args for args in local_args]
    disabled = [DISABLE_APC in args and ENABLE_APC not in args for args in local_args]
    if all(enabled):
        isolation = (
            "requests carry a per-API-key cache_salt, so keys never share cached blocks"
            if salted
            else "this vLLM does not accept cache_salt: API keys share cached blocks"
        )
        return CapabilityReport(
            id=row_id,
            status=CapabilityStatus.EXTERNALLY_MANAGED,
            operations=["automatic_reuse"],
            reason="vLLM's automatic prefix caching (--enable-prefix-caching) owns the reuse; "
            f"Werk cannot name, persist, move, prune or hand off its entries; {isolation}",
        )
    if all(disabled):
        return CapabilityReport(
            id=row_id,
            status=CapabilityStatus.UNSUPPORTED,
            reason="every active vLLM process runs with --no-enable-prefix-caching",
        )
    return CapabilityReport(
        id=row_id,
        status=CapabilityStatus.METADATA_ONLY,
        reason="the active vLLM processes do not all enable prefix caching explicitly (mixed, "
        "or neither flag: vLLM's default decides)",
    )


def _residency_local(context: CapabilityContext, live: list[VllmHandle]) -> CapabilityReport:
    from .process import VllmHandle, check_alive

    runtime = context.runtime
    if runtime is not None and isinstance(runtime.handle, VllmHandle) and check_alive(runtime):
        active = True
    else:
        active = context.model is None and bool(live)
    if active:
        return CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.SUPPORTED,
            operations=["load", "unload"],
        )
    return CapabilityReport(
        id=CapabilityId.MODEL_RESIDENCY,
        status=CapabilityStatus.UNAVAILABLE,
        reason=_no_local_process(),
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    from .process import LIVE

    if context.backend not in (LOCAL, REMOTE):
        return []
    live = [h for h in list(LIVE) if h.alive()]
    remote_active, remote_why = _remote_state()
    local_args = [h.args for h in live]
    salted = all(h.inspection.cache_salt for h in live)
    if context.backend == REMOTE:
        residency = (
            CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY,
                status=CapabilityStatus.EXTERNALLY_MANAGED,
                reason="the remote endpoint owns its lifetime; it may outlive Werk",
            )
            if remote_active
            else CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY,
                status=CapabilityStatus.UNAVAILABLE,
                reason=remote_why,
            )
        )
        why_none = remote_why
    else:
        residency = _residency_local(context, live)
        why_none = _no_local_process() if not live else ""
    return [residency, prefix_cache_row(local_args, remote_active, salted, why_none)]


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """Relay ``/v1`` chat and text completions to the runtime's vLLM server or endpoint."""
    from werk import openai_upstream

    from .process import VllmHandle, check_alive
    from .remote import RemoteHandle

    handle = runtime.handle
    if isinstance(handle, RemoteHandle):
        body = dict(call.body)
        body["model"] = handle.served_model
        if call.cache_salt is not None and handle.endpoint.salt:
            body["cache_salt"] = call.cache_salt
        # The endpoint names its own model; clients see Werk's model id.
        return await openai_upstream(
            handle.http,
            ROUTES[call.route],
            body,
            stream=call.stream,
            what="the remote vLLM",
            # renamed only where the names differ (a rename decodes every chunk)
            model=runtime.model.id if handle.served_model != runtime.model.id else None,
            logger=log,
        )
    if not isinstance(handle, VllmHandle):
        return None
    if not check_alive(runtime):
        raise Unavailable(
            f"the vLLM process of model {runtime.model.id!r} exited; the next request starts "
            "a new one",
            retryable=True,
        )
    body = dict(call.body)
    body["model"] = runtime.model.id  # vLLM serves it under Werk's id: its replies pass as sent
    if call.cache_salt is not None:
        # Werk's per-principal salt always wins over one the client sent: vLLM shares cached
        # prefix blocks between requests with equal salts, i.e. between API keys otherwise.
        body["cache_salt"] = call.cache_salt
    return await openai_upstream(
        handle.http, ROUTES[call.route], body, stream=call.stream, what="vLLM", logger=log
    )
