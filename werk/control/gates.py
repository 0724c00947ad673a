"""Capability gates: turning a status into "go" or the matching typed error.

The seed's rule: *supported* needs no opt-in; *experimental* needs the effective
``allow_experimental: true``; *unavailable* and *unsupported* fail with their codes;
*externally_managed* and *metadata_only* are never presented as Werk-controlled operations.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol import (
    CapabilityReport,
    CapabilityStatus,
    ExperimentalOptInRequired,
    Unavailable,
    Unsupported,
)

__all__ = ["gate", "status_of"]


def status_of(rows: Sequence[CapabilityReport], capability: str) -> CapabilityReport | None:
    for row in rows:
        if row.id == capability:
            return row
    return None


def gate(
    rows: Sequence[CapabilityReport],
    capability: str,
    *,
    allow_experimental: bool,
    probe_on_use: bool = False,
) -> CapabilityStatus:
    """Return the status when the operation may proceed, else raise the matching error.

    :param probe_on_use: an opted-in request may proceed while the capability is
        ``unavailable`` because the adapter proves it on first use (the llama.cpp functional
        probe runs inside the first Prefill); the adapter then stays the authoritative gate.
    """
    row = status_of(rows, capability)
    if row is None:
        raise Unsupported(f"{capability} is not advertised by this backend", capability=capability)
    status = row.status
    reason = row.reason or status.value
    if status is CapabilityStatus.SUPPORTED:
        return status
    if status is CapabilityStatus.EXPERIMENTAL:
        if not allow_experimental:
            raise ExperimentalOptInRequired(
                f"{capability} is experimental; send allow_experimental: true to use it",
                capability=capability,
            )
        return status
    if status is CapabilityStatus.UNAVAILABLE:
        if probe_on_use and allow_experimental:
            return status
        raise Unavailable(f"{capability} is unavailable: {reason}", capability=capability)
    if status is CapabilityStatus.UNSUPPORTED:
        raise Unsupported(f"{capability} is unsupported: {reason}", capability=capability)
    raise Unsupported(
        f"{capability} is {status.value}: Werk does not control it ({reason})",
        capability=capability,
    )
