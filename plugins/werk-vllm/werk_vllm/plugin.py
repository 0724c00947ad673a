"""Werk hook implementations for vLLM: a Werk-started local server and a remote endpoint.

Until the process manager lands, rows are reported for the state Werk can prove now: no active
process, so residency and the automatic prefix cache are ``unavailable``. The plugin implements
no state, prefill/decode or expert hook, so the host reports those rows ``unsupported``
(backend contract 1.1); nothing here repeats that.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    hookimpl,
)

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
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend == LOCAL:
        if shutil.which("vllm") is None:
            why = "no `vllm` executable on PATH"
        else:
            why = "no active Werk-started vLLM process"
        no_endpoint = why
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
