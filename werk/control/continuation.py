"""When a stored state may be handed to a backend beyond its own prompt and process: prefix
continuation and cross-restart restore, read from the backend's capability rows.

**Prefix continuation.** A prefill whose exact prompt has no reusable state may continue the
saved state sharing the longest prefix with it (:mod:`werk.state.prefixes`): the backend
restores it and evaluates only the rest. Only a backend that says so gets such a state: its
``runtime.state.restore.prefix`` row is ``supported``, or ``experimental`` with the request's
opt-in. A backend that proves its rows on first use (every state row still ``unavailable``
because its functional probe has not run in this process generation) is offered the candidate
with the opt-in, and its row is read again after the restore (:func:`prefix_proven`): the host
never continues a prefix the backend has not proven.

**Cross-restart restore** (:func:`why_not_across`): the same reading for a state an earlier
process generation saved.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..protocol import CapabilityId, CapabilityReport, CapabilityStatus
from .gates import status_of

__all__ = ["prefix_offered", "prefix_proven", "why_not_across"]


def prefix_proven(rows: Sequence[CapabilityReport], allow_experimental: bool) -> bool:
    """Whether the backend's prefix-continuation row lets this request continue a prefix."""
    row = status_of(rows, CapabilityId.STATE_RESTORE_PREFIX)
    if row is None:
        return False
    if row.status is CapabilityStatus.SUPPORTED:
        return True
    return row.status is CapabilityStatus.EXPERIMENTAL and allow_experimental


def prefix_offered(rows: Sequence[CapabilityReport], allow_experimental: bool) -> bool:
    """Whether to look for a prefix candidate at all: proven, or (with the opt-in) not yet
    proven because the backend's probe runs on first use (its restore row is ``unavailable``
    too, as the prefix row is)."""
    if prefix_proven(rows, allow_experimental):
        return True
    if not allow_experimental:
        return False
    prefix = status_of(rows, CapabilityId.STATE_RESTORE_PREFIX)
    restore = status_of(rows, CapabilityId.STATE_RESTORE)
    return (
        prefix is not None
        and restore is not None
        and prefix.status is CapabilityStatus.UNAVAILABLE
        and restore.status is CapabilityStatus.UNAVAILABLE
    )


def why_not_across(rows: Sequence[CapabilityReport], allow_experimental: bool) -> str | None:
    """``None`` when an earlier generation's disk state may be handed to the backend: its
    cross-restart row is ``experimental`` (or ``supported``) for this generation, or — with
    the opt-in — both that row and ``runtime.state.restore`` are ``unavailable`` because the
    backend's proof runs on first use (the backend then checks, and refuses with
    ``incompatible_state``). Otherwise why not, from the row: a backend whose restore works
    but whose cross-restart row is not a claim never gets such a state."""
    cross = status_of(rows, CapabilityId.STATE_RESTORE_CROSS_RESTART)
    restore = status_of(rows, CapabilityId.STATE_RESTORE)
    if cross is None:
        return "the backend does not report cross-restart restore"
    why = f"cross-restart restore is {cross.status.value}: {cross.reason or 'no reason given'}"
    if cross.status is CapabilityStatus.SUPPORTED:
        return None
    if not allow_experimental:
        if cross.status is CapabilityStatus.EXPERIMENTAL:
            return "cross-restart restore is experimental and the request did not opt in"
        return why
    if restore is None:
        return "the backend reports no runtime.state.restore row"
    if cross.status is CapabilityStatus.EXPERIMENTAL:
        return None
    if (
        cross.status is CapabilityStatus.UNAVAILABLE
        and restore.status is CapabilityStatus.UNAVAILABLE
    ):
        return None  # the backend proves it on first use, and refuses if it cannot
    return why
