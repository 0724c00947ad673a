"""Capability statuses, the core capability ids, and the capability report shapes (§2–3)."""

from __future__ import annotations

import enum
import re
from typing import Annotated

import msgspec

from .base import Response

__all__ = [
    "CORE_CAPABILITY_IDS",
    "CapabilitiesResponse",
    "CapabilityId",
    "CapabilityReport",
    "CapabilityStatus",
    "validate_capability_id",
]


class CapabilityStatus(enum.StrEnum):
    """Exactly six statuses; never collapse them into a boolean (seed: status semantics)."""

    SUPPORTED = "supported"
    """Operational through the active adapter without an experimental opt-in."""
    UNSUPPORTED = "unsupported"
    """The active adapter does not implement the operation."""
    UNAVAILABLE = "unavailable"
    """The contract exists, but a runtime, process, probe or telemetry prerequisite is missing."""
    EXPERIMENTAL = "experimental"
    """Implemented; accepted only with an effective ``allow_experimental: true``."""
    EXTERNALLY_MANAGED = "externally_managed"
    """Another component owns the behaviour; Werk reports it but will not mutate it."""
    METADATA_ONLY = "metadata_only"
    """Informational only; implies no handle and no control operation."""


class CapabilityId(enum.StrEnum):
    """The capability ids defined by the protocol. Plugins add ``<backend>.<name>`` ids."""

    MEMORY_TELEMETRY_HOST = "runtime.memory.telemetry.host"
    MEMORY_TELEMETRY_ACCELERATOR = "runtime.memory.telemetry.accelerator"
    MEMORY_RESERVATIONS = "runtime.memory.reservations"
    MODEL_RESIDENCY = "runtime.model_residency"
    STATE_PREFIX_CACHE = "runtime.state.prefix_cache"
    STATE_PERSISTENCE = "runtime.state.persistence"
    STATE_RESTORE = "runtime.state.restore"
    STATE_TIER_DISK = "runtime.state.tier.disk"
    STATE_RESTORE_CROSS_RESTART = "runtime.state.restore.cross_restart"
    STATE_RESTORE_PREFIX = "runtime.state.restore.prefix"
    """A restored state whose prompt is only a prefix of the new one is continued: the backend
    evaluates only the rest (a growing conversation continues from its last saved state)."""
    STATE_TIER_RAM = "runtime.state.tier.ram"
    STATE_TIER_VRAM = "runtime.state.tier.vram"
    PD_PREFILL = "runtime.pd.prefill"
    PD_DECODE = "runtime.pd.decode"
    PD_HANDOFF = "runtime.pd.handoff"
    EXPERTS_RESIDENCY = "runtime.experts.residency"


CORE_CAPABILITY_IDS: frozenset[str] = frozenset(c.value for c in CapabilityId)

_PLUGIN_ID = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_]*)+$")


def validate_capability_id(capability_id: str) -> str:
    """Return ``capability_id`` if it is a core id or a plugin id outside ``runtime.``.

    :raises ValueError: for an id that redefines the ``runtime.`` namespace or is malformed.
    """
    if capability_id in CORE_CAPABILITY_IDS:
        return capability_id
    if capability_id.startswith("runtime."):
        raise ValueError(f"unknown core capability id {capability_id!r}")
    if not _PLUGIN_ID.match(capability_id) or len(capability_id) > 128:
        raise ValueError(f"capability id {capability_id!r} must look like '<backend>.<name>'")
    return capability_id


class CapabilityReport(Response, frozen=True, kw_only=True):
    """One row of the capability matrix.

    :ivar id: a core id (:class:`CapabilityId`) or ``<backend>.<name>``.
    :ivar status: one of the six :class:`CapabilityStatus` values.
    :ivar backend: the backend it is for (the host fills it in), or null for host rows.
    :ivar model: the model it is for; null for host-level rows and for backend-wide rows
        reported before any model of that backend is configured (the host fills it in).
    :ivar operations: the operations it offers (``["restore"]``), if it names some.
    :ivar reason: why; required for every status other than ``supported``.
    """

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    status: CapabilityStatus
    backend: str | None = None
    model: str | None = None
    operations: list[str] = msgspec.field(default_factory=list)
    reason: str | None = None

    def __post_init__(self) -> None:
        validate_capability_id(self.id)
        if self.status is not CapabilityStatus.SUPPORTED and not self.reason:
            raise ValueError(f"capability {self.id!r} is {self.status} and needs a reason")


class CapabilitiesResponse(Response, frozen=True, kw_only=True):
    """``GET /werk/v1/capabilities`` body."""

    protocol: str
    capabilities: list[CapabilityReport]
