"""Model residency and expert residency shapes (§7)."""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from .base import Request, Response

__all__ = [
    "MAX_EXPERTS_PER_REQUEST",
    "ExpertAction",
    "ExpertActionRequest",
    "ExpertActionResult",
    "ExpertInfo",
    "ExpertList",
    "ExpertSkip",
    "ExpertTier",
    "ModelInfo",
    "ModelList",
    "ResidencyRequest",
    "ResidencyResult",
]

MAX_EXPERTS_PER_REQUEST = 4096

ExpertId = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]


class ModelInfo(Response, frozen=True, kw_only=True):
    id: str
    backend: str
    identity: str
    resident: bool | None = None


class ModelList(Response, frozen=True, kw_only=True):
    models: list[ModelInfo]


class ResidencyRequest(Request, frozen=True, kw_only=True):
    dry_run: bool = False


class ResidencyResult(Response, frozen=True, kw_only=True):
    model: str
    resident: bool


class ExpertTier(enum.StrEnum):
    VRAM = "vram"
    RAM = "ram"
    EXTERNAL = "external"


class ExpertInfo(Response, frozen=True, kw_only=True):
    id: str
    tier: ExpertTier
    bytes: int | None
    hotness: float
    pinned: bool


class ExpertList(Response, frozen=True, kw_only=True):
    model: str
    experts: list[ExpertInfo]


class ExpertActionRequest(Request, frozen=True, kw_only=True):
    """``POST /werk/v1/experts/{model}/prefetch|evict``. Dry run and no opt-in by default."""

    experts: Annotated[
        list[ExpertId], msgspec.Meta(min_length=1, max_length=MAX_EXPERTS_PER_REQUEST)
    ]
    target: ExpertTier = ExpertTier.RAM
    dry_run: bool = True
    allow_experimental: bool = False


class ExpertAction(Response, frozen=True, kw_only=True):
    id: str
    from_: ExpertTier = msgspec.field(name="from")
    to: ExpertTier


class ExpertSkip(Response, frozen=True, kw_only=True):
    id: str
    reason: str


class ExpertActionResult(Response, frozen=True, kw_only=True):
    dry_run: bool
    planned: list[ExpertAction]
    applied: list[ExpertAction]
    skipped: list[ExpertSkip]
