"""Effective Prefill policy: defaults, retention tier and reuse decisions (pure functions).

Nothing here touches files, processes or clocks. Each rule quotes the seed sentence it
implements ("Persistence and reuse policy", "Server-side Prefill defaults", "Compatibility
envelope").
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import NamedTuple

import msgspec

from ..protocol.capabilities import CapabilityId, CapabilityStatus
from ..protocol.errors import (
    ExperimentalOptInRequired,
    IncompatibleState,
    ReuseUnavailable,
    Unavailable,
    Unsupported,
)
from ..protocol.policy import PersistenceDefaults, Policy, Retention, Reuse
from ..protocol.prefill import PrefillRequest, ReuseOutcome
from ..protocol.states import Tier
from .envelope import Envelope

__all__ = [
    "DISK_CAPABILITIES",
    "EffectivePrefill",
    "Lookup",
    "classify_candidates",
    "decide_reuse",
    "effective_prefill_policy",
    "operational",
    "resolve_retention",
]


class EffectivePrefill(NamedTuple):
    """The policy and experimental opt-in a Prefill request actually runs with."""

    policy: Policy
    allow_experimental: bool


def effective_prefill_policy(
    request: PrefillRequest, defaults: PersistenceDefaults | None
) -> EffectivePrefill:
    """Apply the server's Prefill defaults to the request's *absent* top-level members only.

    * *"These policy defaults apply to absent top-level members of POST /werk/v1/prefill."* —
      an absent ``policy`` takes ``defaults.policy()``, or the protocol defaults
      (``ephemeral``/``disabled``/no TTL/no pin) when the server has none.
    * *"A present policy object owns the complete request policy"* — a present ``policy`` is
      used as decoded (its own absent members already took the protocol defaults); server
      defaults never fill its members.
    * *"It also supplies the experimental opt-in when allow_experimental is omitted."* — an
      absent ``allow_experimental`` takes ``defaults.allow_experimental``, or ``False`` without
      server defaults.
    * *"a present allow_experimental Boolean owns the opt-in decision. Explicit false is never
      promoted to true by server configuration."*
    """
    if isinstance(request.policy, Policy):
        policy = request.policy
    else:
        policy = defaults.policy() if defaults is not None else Policy()
    if request.allow_experimental is msgspec.UNSET:
        allow = defaults.allow_experimental if defaults is not None else False
    else:
        allow = bool(request.allow_experimental)
    return EffectivePrefill(policy, allow)


# --- retention tier -------------------------------------------------------------------------

DISK_CAPABILITIES: tuple[CapabilityId, ...] = (
    CapabilityId.STATE_PERSISTENCE,
    CapabilityId.STATE_TIER_DISK,
)
"""*"disk: Require operational persistence and a disk-persistable opaque snapshot"*."""

_MEMORY_CAPABILITIES: tuple[tuple[CapabilityId, Tier], ...] = (
    (CapabilityId.STATE_TIER_RAM, Tier.RAM),
    (CapabilityId.STATE_TIER_VRAM, Tier.VRAM),
)
"""RAM first: host memory is the larger tier and leaves accelerator memory to inference."""

_REFUSAL_RANK = {CapabilityStatus.EXPERIMENTAL: 0, CapabilityStatus.UNAVAILABLE: 1}


def operational(status: CapabilityStatus | None, *, allow_experimental: bool) -> bool:
    """``supported``, or ``experimental`` with an effective opt-in. Absent means not offered."""
    return status is CapabilityStatus.SUPPORTED or (
        status is CapabilityStatus.EXPERIMENTAL and allow_experimental
    )


def _refuse(
    capability: CapabilityId, status: CapabilityStatus | None, retention: Retention
) -> Exception:
    """The typed error for a required capability that is not operational."""
    what = f"retention '{retention}' needs capability {capability}"
    if status is CapabilityStatus.EXPERIMENTAL:
        return ExperimentalOptInRequired(
            f"{what}, which is experimental; send allow_experimental: true to opt in",
            capability=capability,
        )
    if status is CapabilityStatus.UNAVAILABLE:
        return Unavailable(f"{what}, which is unavailable right now", capability=capability)
    shown = "not offered" if status is None else str(status)
    return Unsupported(
        f"{what}, which the active adapter reports as {shown}", capability=capability
    )


def resolve_retention(
    policy: Policy,
    statuses: Mapping[str, CapabilityStatus] | Mapping[CapabilityId, CapabilityStatus],
    *,
    allow_experimental: bool,
) -> Tier | None:
    """The tier a new named state goes to, or ``None`` for ``ephemeral`` (no named state).

    :param statuses: the active runtime's capability statuses by id (a capability missing from
        the mapping is not offered by the adapter). They must be the statuses that hold *now*
        (after any functional probe), since the server is the authoritative gate.
    :raises werk.Unsupported | werk.Unavailable | werk.ExperimentalOptInRequired: ``memory`` or
        ``disk`` cannot be provided; the error names the missing capability.

    * ``ephemeral`` — *"Issue only the short-lived decode handoff; do not create a named
      reusable state."*
    * ``memory`` — *"Require an operational RAM or VRAM state tier; fail if the adapter cannot
      retain one."*
    * ``disk`` — *"Require operational persistence and a disk-persistable opaque snapshot; fail
      instead of silently weakening the request."*
    * ``auto`` — *"Prefer a disk snapshot when the adapter can produce one, otherwise retain the
      backend state as a volatile named state"* (tier ``backend``). An experimental disk tier
      counts only with the opt-in; without it ``auto`` stays volatile.
    """
    retention = policy.retention
    if retention is Retention.EPHEMERAL:
        return None
    if retention is Retention.MEMORY:
        for capability, tier in _MEMORY_CAPABILITIES:
            if operational(statuses.get(capability), allow_experimental=allow_experimental):
                return tier
        # Name the most telling refusal: an opt-in or an outage beats "not offered".
        capability, status = min(
            ((c, statuses.get(c)) for c, _ in _MEMORY_CAPABILITIES),
            key=lambda pair: _REFUSAL_RANK.get(pair[1], 2) if pair[1] is not None else 3,
        )
        raise _refuse(capability, status, retention)
    disk_ready = all(
        operational(statuses.get(c), allow_experimental=allow_experimental)
        for c in DISK_CAPABILITIES
    )
    if disk_ready:
        return Tier.DISK
    if retention is Retention.DISK:
        for capability in DISK_CAPABILITIES:
            status = statuses.get(capability)
            if not operational(status, allow_experimental=allow_experimental):
                raise _refuse(capability, status, retention)
    return Tier.BACKEND


# --- reuse ----------------------------------------------------------------------------------


class Lookup(enum.Enum):
    """What a catalog lookup for a reusable state found."""

    MISS = "miss"
    """No state at all (unknown, expired and invalid states count as absent)."""
    INCOMPATIBLE = "incompatible"
    """A state exists, but its producer envelope differs from the runtime's."""
    COMPATIBLE = "compatible"
    """A state whose complete envelope equals the runtime's."""


def classify_candidates(runtime: Envelope, candidates: Iterable[Envelope]) -> Lookup:
    """Classify the envelopes of the states matching a prompt fingerprint.

    *"Reuse is an equality check over the complete producer envelope … There are no wildcard
    dimensions … incompatible_state is distinct from a simple cache miss."*
    """
    seen = False
    for envelope in candidates:
        if envelope.compatible_with(runtime):
            return Lookup.COMPATIBLE
        seen = True
    return Lookup.INCOMPATIBLE if seen else Lookup.MISS


def decide_reuse(reuse: Reuse, lookup: Lookup) -> ReuseOutcome:
    """Whether this prefill continues from a stored state, starts fresh, or fails.

    * ``disabled`` → ``disabled`` (no lookup is consulted).
    * ``prefer`` — *"uses an exactly compatible state when available and otherwise performs a
      new prefill"*: ``compatible`` → ``reused``; ``miss`` or ``incompatible`` → ``fresh``.
    * ``required`` — *"fails if compatible reuse cannot be proven; it never falls through to a
      fresh prefill"*: ``compatible`` → ``reused``; ``miss`` → :class:`werk.ReuseUnavailable`;
      ``incompatible`` → :class:`werk.IncompatibleState` (distinct from a miss).
    """
    if reuse is Reuse.DISABLED:
        return ReuseOutcome.DISABLED
    if lookup is Lookup.COMPATIBLE:
        return ReuseOutcome.REUSED
    if reuse is Reuse.PREFER:
        return ReuseOutcome.FRESH
    if lookup is Lookup.INCOMPATIBLE:
        raise IncompatibleState(
            "a stored state exists for this prompt, but the runtime that produced it differs "
            "from the active one; reuse: required cannot be satisfied"
        )
    raise ReuseUnavailable("reuse: required, but no compatible reusable state exists")
