"""Persistence and reuse policy (§6, seed "Persistence and reuse policy")."""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

from .base import Request, Response

__all__ = [
    "TTL_MAX_SECONDS",
    "TTL_MIN_SECONDS",
    "PersistenceDefaults",
    "Policy",
    "Retention",
    "Reuse",
    "TtlSeconds",
]

TTL_MIN_SECONDS = 1
TTL_MAX_SECONDS = 2_592_000  # 30 days

TtlSeconds = Annotated[int, msgspec.Meta(ge=TTL_MIN_SECONDS, le=TTL_MAX_SECONDS)]
"""A named state's time to live: 1..2592000 seconds."""


class Retention(enum.StrEnum):
    EPHEMERAL = "ephemeral"
    """Only a short-lived decode handoff; no named reusable state."""
    MEMORY = "memory"
    """Require an operational RAM or VRAM tier; fail if the adapter cannot retain one."""
    DISK = "disk"
    """Require a disk-persistable snapshot; fail instead of weakening."""
    AUTO = "auto"
    """Disk when the adapter can produce it, else a volatile named state."""


class Reuse(enum.StrEnum):
    DISABLED = "disabled"
    PREFER = "prefer"
    """Use an exactly compatible state when available, else prefill fresh."""
    REQUIRED = "required"
    """Fail unless compatible reuse is proven; never falls through to a fresh prefill."""


class Policy(Request, frozen=True, kw_only=True):
    """A complete request policy. Absent members take the protocol defaults below.

    :ivar retention: what to keep: ``ephemeral`` (only the handoff), ``memory``, ``disk`` or
        ``auto`` (disk when the adapter can, else a volatile state).
    :ivar reuse: ``disabled``, ``prefer`` (a compatible state when one exists) or ``required``.
    :ivar ttl_seconds: how long a kept state lives (1..2592000), or ``None`` for the default.
    :ivar pin: keep the state from eviction and pruning.
    """

    retention: Retention = Retention.EPHEMERAL
    reuse: Reuse = Reuse.DISABLED
    ttl_seconds: TtlSeconds | None = None
    pin: bool = False


class PersistenceDefaults(Response, frozen=True, kw_only=True):
    """The server's Prefill defaults (``werk serve --persistence``), shown in ``/info``.

    :ivar retention: the default retention (``auto``).
    :ivar reuse: the default reuse (``prefer``).
    :ivar ttl_seconds: the default TTL of kept states, or ``None``.
    :ivar pin: whether kept states are pinned by default.
    :ivar allow_experimental: the default opt-in to ``experimental`` capabilities.
    """

    retention: Retention = Retention.AUTO
    reuse: Reuse = Reuse.PREFER
    ttl_seconds: TtlSeconds | None = None
    pin: bool = False
    allow_experimental: bool = True

    def policy(self) -> Policy:
        return Policy(
            retention=self.retention, reuse=self.reuse, ttl_seconds=self.ttl_seconds, pin=self.pin
        )
