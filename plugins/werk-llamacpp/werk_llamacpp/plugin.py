"""Werk hook implementations for the llama.cpp backend.

Today the plugin registers the ``llamacpp`` backend and reports its capability rows truthfully
for a process that has not (yet) passed the functional state probe: the seed's "llama.cpp
before/after a failed state probe" column. No runtime is started yet, so nothing is
``experimental`` and residency is ``unavailable``.
"""

from __future__ import annotations

from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    hookimpl,
)

from .executable import locate_llama_server

BACKEND = "llamacpp"

_NO_PROBE = "the functional state probe has not passed for a live llama-server process"

_PROBE_GATED = (
    (CapabilityId.STATE_PREFIX_CACHE, ["prefill"]),
    (CapabilityId.STATE_PERSISTENCE, ["prefill", "snapshot"]),
    (CapabilityId.STATE_RESTORE, ["restore"]),
    (CapabilityId.STATE_TIER_DISK, ["snapshot", "restore"]),
    (CapabilityId.PD_PREFILL, ["prefill"]),
    (CapabilityId.PD_DECODE, ["decode"]),
    (CapabilityId.PD_HANDOFF, ["prefill", "decode"]),
)


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("gguf",),
            description="llama.cpp llama-server, one managed child process per model",
        )
    )


def _residency(context: CapabilityContext) -> CapabilityReport:
    located = locate_llama_server()
    if located.path is None:
        reason = f"no llama-server executable found ({located.reason})"
    elif context.model is None:
        reason = "no GGUF model is configured for llama.cpp"
    else:
        reason = "Werk cannot start managed llama-server runtimes yet"
    return CapabilityReport(
        id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=reason
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    rows = [_residency(context)]
    rows += [
        CapabilityReport(
            id=cap, status=CapabilityStatus.UNAVAILABLE, operations=ops, reason=_NO_PROBE
        )
        for cap, ops in _PROBE_GATED
    ]
    rows.append(
        CapabilityReport(
            id=CapabilityId.STATE_RESTORE_CROSS_RESTART,
            status=CapabilityStatus.UNAVAILABLE,
            reason="snapshots are bound to the live process generation that produced them",
        )
    )
    rows += [
        CapabilityReport(
            id=cap,
            status=CapabilityStatus.UNSUPPORTED,
            reason="llama-server keeps slot state only in its own process; no RAM/VRAM tier API",
        )
        for cap in (CapabilityId.STATE_TIER_RAM, CapabilityId.STATE_TIER_VRAM)
    ]
    rows.append(
        CapabilityReport(
            id=CapabilityId.EXPERTS_RESIDENCY,
            status=CapabilityStatus.UNSUPPORTED,
            reason="llama-server exposes no expert movement operation",
        )
    )
    return rows
