"""State summaries and the state mutation requests/results (§5)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from .base import Request, Response

__all__ = [
    "MAX_PRUNE_IDS",
    "PinRequest",
    "PinResult",
    "PruneFilter",
    "PruneRequest",
    "PruneResult",
    "PruneSkip",
    "SkipReason",
    "StateId",
    "StateList",
    "StateStatus",
    "StateSummary",
    "Tier",
    "TierRequest",
    "TierResult",
]

MAX_PRUNE_IDS = 1024

StateId = Annotated[str, msgspec.Meta(pattern=r"^st_[A-Za-z0-9_-]{8,64}$")]
"""An opaque state id, ``st_`` + random characters. Never derived from client input."""

ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class Tier(enum.StrEnum):
    BACKEND = "backend"
    """A volatile named state held live by the backend process."""
    RAM = "ram"
    VRAM = "vram"
    DISK = "disk"


class StateStatus(enum.StrEnum):
    READY = "ready"
    EXPIRED = "expired"
    INVALID = "invalid"


class StateSummary(Response, frozen=True, kw_only=True):
    """What a client may know about a state: never handles, keys, paths, prompts or secrets."""

    id: str
    model: str
    backend: str
    tier: Tier
    status: StateStatus
    logical_bytes: int | None
    created_at: str
    last_accessed_at: str | None = None
    expires_at: str | None = None
    pinned: bool = False
    reusable: bool = True
    reusable_reason: str | None = None
    """Why ``reusable`` is false right now (``null`` when it is true)."""


class StateList(Response, frozen=True, kw_only=True):
    """``GET /werk/v1/states``: the states by id (creation order). ``next_cursor`` is set when
    the listing was asked for a ``limit`` and more states may follow (pass it as ``cursor``)."""

    states: list[StateSummary]
    next_cursor: str | None = None


class PruneFilter(Request, frozen=True, kw_only=True):
    """A constrained selector. At least one member must be present (an empty filter is invalid)."""

    model: ModelId | None = None
    tier: Tier | None = None
    older_than_seconds: Annotated[int, msgspec.Meta(ge=0, le=10 * 365 * 86400)] | None = None
    expired: Literal[True] | None = None

    def __post_init__(self) -> None:
        if (
            self.model is None
            and self.tier is None
            and self.older_than_seconds is None
            and self.expired is None
        ):
            raise ValueError("an empty prune filter is not allowed; name at least one constraint")


class PruneRequest(Request, frozen=True, kw_only=True):
    """Exactly one selector: ``ids``, ``filter``, or ``all`` with ``confirm: "all"``."""

    ids: Annotated[list[StateId], msgspec.Meta(min_length=1, max_length=MAX_PRUNE_IDS)] | None = (
        None
    )
    filter: PruneFilter | None = None
    all: bool | None = None
    confirm: Literal["all"] | None = None
    dry_run: bool = True

    def __post_init__(self) -> None:
        chosen = sum(x is not None for x in (self.ids, self.filter, self.all))
        if chosen != 1:
            raise ValueError("give exactly one of 'ids', 'filter' or 'all'")
        if self.all is not None:
            if self.all is not True:
                raise ValueError("'all' must be true when present")
            if self.confirm != "all":
                raise ValueError(
                    "pruning all states needs the separate confirmation 'confirm: all'"
                )
        elif self.confirm is not None:
            raise ValueError("'confirm' is only valid together with 'all'")


class SkipReason(enum.StrEnum):
    PINNED = "pinned"
    LIVE_HANDOFF = "live_handoff"
    ACTIVE = "active"


class PruneSkip(Response, frozen=True, kw_only=True):
    id: str
    reason: SkipReason


class PruneResult(Response, frozen=True, kw_only=True):
    dry_run: bool
    selected: list[str]
    deleted: list[str]
    skipped: list[PruneSkip]


class PinRequest(Request, frozen=True, kw_only=True):
    pinned: bool
    dry_run: bool = True


class PinResult(Response, frozen=True, kw_only=True):
    dry_run: bool
    state: StateSummary


class TierRequest(Request, frozen=True, kw_only=True):
    target: Tier
    dry_run: bool = True


class TierResult(Response, frozen=True, kw_only=True):
    dry_run: bool
    state: StateSummary
    estimated_bytes: int | None = None
