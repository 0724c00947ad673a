"""Werk hook implementations for the Diffusers/Transformers media worker.

Media pipelines have model residency but no text KV state: every state and prefill/decode row
is ``unsupported``; residency is ``unavailable`` until the worker's Python libraries are
installed and a worker can be started.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    hookimpl,
)

BACKEND = "media"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("diffusers", "transformers"),
            description="a resident Diffusers/Transformers media worker",
        )
    )


def _residency_reason() -> str:
    missing = [
        m for m in ("torch", "diffusers", "transformers") if importlib.util.find_spec(m) is None
    ]
    if missing:
        return f"the media worker needs {', '.join(missing)} installed"
    return "no media worker has been started"


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    rows = [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.UNAVAILABLE,
            reason=_residency_reason(),
        ),
    ]
    no_kv = "media pipelines keep no text KV state"
    rows += [
        CapabilityReport(id=cap, status=CapabilityStatus.UNSUPPORTED, reason=no_kv)
        for cap in (
            CapabilityId.STATE_PREFIX_CACHE,
            CapabilityId.STATE_PERSISTENCE,
            CapabilityId.STATE_RESTORE,
            CapabilityId.STATE_TIER_DISK,
            CapabilityId.STATE_TIER_RAM,
            CapabilityId.STATE_TIER_VRAM,
            CapabilityId.PD_PREFILL,
            CapabilityId.PD_DECODE,
            CapabilityId.PD_HANDOFF,
        )
    ]
    rows.append(
        CapabilityReport(
            id=CapabilityId.EXPERTS_RESIDENCY,
            status=CapabilityStatus.UNSUPPORTED,
            reason="the media worker has no expert movement operation",
        )
    )
    return rows
