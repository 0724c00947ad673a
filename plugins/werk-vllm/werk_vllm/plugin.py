"""Werk hook implementations for vLLM: a Werk-started local server and a remote endpoint.

Neither can run on a machine without a GPU and vLLM; until the process manager lands, rows are
reported for the state Werk can prove now: no active process, so residency and the automatic
prefix cache are ``unavailable``, and named states are ``unsupported`` (vLLM exposes no
snapshot/restore contract).
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

_NO_NAMED_STATE = "vLLM exposes no named snapshot/restore or split prefill/decode contract"


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


def _unsupported(reason: str, *caps: CapabilityId) -> list[CapabilityReport]:
    return [
        CapabilityReport(id=c, status=CapabilityStatus.UNSUPPORTED, reason=reason) for c in caps
    ]


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
    rows += _unsupported(
        _NO_NAMED_STATE,
        CapabilityId.STATE_PERSISTENCE,
        CapabilityId.STATE_RESTORE,
        CapabilityId.STATE_TIER_DISK,
        CapabilityId.PD_PREFILL,
        CapabilityId.PD_DECODE,
        CapabilityId.PD_HANDOFF,
    )
    rows += _unsupported(
        "vLLM KV offload is outside the adapter",
        CapabilityId.STATE_TIER_RAM,
        CapabilityId.STATE_TIER_VRAM,
    )
    rows += _unsupported(
        "vLLM exposes no expert movement operation", CapabilityId.EXPERTS_RESIDENCY
    )
    return rows
