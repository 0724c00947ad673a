"""``GET /werk/v1/memory`` shapes (§4). ``None`` always means "not observed", never zero."""

from __future__ import annotations

import enum

from .base import Response

__all__ = [
    "AcceleratorMemory",
    "HostMemory",
    "ManagedMemory",
    "MemoryCounters",
    "MemoryResponse",
    "PressureLevel",
]


class PressureLevel(enum.StrEnum):
    NORMAL = "normal"
    SOFT = "soft"
    HARD = "hard"
    EMERGENCY = "emergency"
    UNKNOWN = "unknown"


class HostMemory(Response, frozen=True, kw_only=True):
    total_bytes: int
    used_bytes: int
    available_bytes: int


class AcceleratorMemory(Response, frozen=True, kw_only=True):
    index: int
    name: str
    total_bytes: int | None
    used_bytes: int | None


class ManagedMemory(Response, frozen=True, kw_only=True):
    allocated_bytes: int = 0
    reserved_bytes: int = 0


class MemoryCounters(Response, frozen=True, kw_only=True):
    failed_releases: int = 0
    orphaned_release_bytes: int = 0
    telemetry_errors: int = 0
    backend_cleanup_failures: int = 0
    backend_cleanup_latched: int = 0


class MemoryResponse(Response, frozen=True, kw_only=True):
    """``accelerators: []`` = sampled, none present; ``None`` = could not sample."""

    sampled_at: str
    unified: bool
    host: HostMemory | None
    accelerators: list[AcceleratorMemory] | None
    managed: ManagedMemory
    pressure: PressureLevel
    counters: MemoryCounters
