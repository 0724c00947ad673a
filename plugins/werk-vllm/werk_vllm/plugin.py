"""Werk hook implementations for vLLM: a Werk-started local server and a remote endpoint.

``werk backends install vllm`` builds vLLM's environment (:mod:`.environment`) and
``werk models create-demo --kind vllm`` writes a tiny model with it. Until the process manager
lands, rows are reported for the state Werk can prove now: no active process, so residency and
the automatic prefix cache are ``unavailable`` (the reason names the install command when vLLM
is missing). The plugin implements
no state, prefill/decode or expert hook, so the host reports those rows ``unsupported``
(backend contract 1.1); nothing here repeats that.
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
    hookimpl,
)

from .environment import DEMO, INSTALL_HINT, environment_spec, managed_python

LOCAL = "vllm"
REMOTE = "vllm-remote"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=LOCAL,
            formats=("safetensors", "hf"),
            description="a Werk-started local `vllm serve` process",
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


def _local_prerequisite() -> str:
    if os.environ.get("WERK_VLLM_PYTHON"):
        return "WERK_VLLM_PYTHON is set, but Werk does not start vLLM processes yet"
    if managed_python() is None:
        return f"vLLM is not installed; {INSTALL_HINT}"
    return "vLLM is installed (managed environment), but Werk does not start vLLM processes yet"


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend == LOCAL:
        no_endpoint = _local_prerequisite()
    else:
        no_endpoint = "no remote vLLM endpoint is configured"
    rows = [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=no_endpoint
        ),
        CapabilityReport(
            id=CapabilityId.STATE_PREFIX_CACHE,
            status=CapabilityStatus.UNAVAILABLE,
            reason=f"{no_endpoint}; automatic prefix caching is backend-owned",
        ),
    ]
    return rows
