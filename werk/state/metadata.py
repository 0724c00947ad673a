"""What the catalog records about one state: the on-disk metadata and the in-memory view.

``metadata.json`` is a :class:`StateMetadata` (strict: unknown fields, a wrong schema version or
an out-of-range value make the whole state invalid). ``metadata.sha256`` holds the SHA-256 of
the exact ``metadata.json`` bytes; the payload's size and SHA-256 live inside the metadata.
:class:`StoredState` is what the catalog hands out: metadata plus the mutable per-state facts
kept in their own files (``pinned``, ``last-accessed``).
"""

from __future__ import annotations

import math
import re
import secrets
import threading
import time
from typing import Annotated, Literal

import msgspec

from ..protocol.base import rfc3339
from ..protocol.states import StateStatus, StateSummary, Tier
from .envelope import Envelope
from .prefixes import MAX_CHAIN, PREFIX_PATTERN

__all__ = [
    "FINGERPRINT_PATTERN",
    "PRINCIPAL_PATTERN",
    "SCHEMA_VERSION",
    "STATE_ID_PATTERN",
    "StateMetadata",
    "StoredState",
    "decode_metadata",
    "encode_metadata",
    "new_state_id",
    "principal_dir_name",
    "principal_from_dir_name",
]

SCHEMA_VERSION: Literal[1] = 1

PRINCIPAL_PATTERN = re.compile(r"^(?:local|p_[0-9a-f]{64})$")
"""``local`` or ``p_`` + 64 lower-case hex digits (same shape as :mod:`werk.state.principals`)."""

STATE_ID_PATTERN = re.compile(r"^st_[A-Za-z0-9_-]{8,64}$")
"""Same as :data:`werk.protocol.states.StateId`."""

_ID_LOCK = threading.Lock()
_LAST_ID_MS = 0


def new_state_id() -> str:
    """A fresh state id: ``st_`` + 11 hex digits of milliseconds + 16 random characters.

    Ids sort in the order they were made (strictly within one process: two in the same
    millisecond take the next one), so a listing ordered by id is in creation order and can be
    paged by id without reading every state's metadata.
    """
    global _LAST_ID_MS
    with _ID_LOCK:
        _LAST_ID_MS = max(time.time_ns() // 1_000_000, _LAST_ID_MS + 1)
        stamp = _LAST_ID_MS
    return f"st_{stamp:011x}{secrets.token_urlsafe(12)}"


FINGERPRINT_PATTERN = re.compile(r"^pf_[0-9a-f]{64}$")
"""A keyed, principal-scoped prompt fingerprint (``pf_`` + HMAC-SHA-256 hex)."""

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
_Time = Annotated[float, msgspec.Meta(ge=0)]
_Bytes = Annotated[int, msgspec.Meta(ge=0)]


class StateMetadata(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """The content of ``metadata.json`` (schema version 1).

    ``prefixes`` (the prompt's prefix fingerprints, :mod:`werk.state.prefixes`) and ``origin``
    are written only when set, so a state without them has the same bytes as before the
    fields existed."""

    schema: Literal[1]
    id: Annotated[str, msgspec.Meta(pattern=STATE_ID_PATTERN.pattern)]
    principal: Annotated[str, msgspec.Meta(pattern=PRINCIPAL_PATTERN.pattern)]
    envelope: Envelope
    model: _Name
    backend: _Name
    tier: Tier
    fingerprint: Annotated[str, msgspec.Meta(pattern=FINGERPRINT_PATTERN.pattern)]
    created_at: _Time
    expires_at: _Time | None
    logical_bytes: _Bytes | None
    payload_bytes: _Bytes
    payload_sha256: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]
    prefixes: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=PREFIX_PATTERN)], ...],
        msgspec.Meta(max_length=MAX_CHAIN),
    ] = ()
    origin: Literal["chat"] | None = None
    """``chat``: kept by a persisted ``/v1`` chat turn (the next turn supersedes it)."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(StateMetadata)


def encode_metadata(meta: StateMetadata) -> bytes:
    """The exact bytes written to ``metadata.json``."""
    return _encoder.encode(meta)


def decode_metadata(data: bytes) -> StateMetadata:
    """Decode ``metadata.json``; raises :class:`ValueError` for anything malformed."""
    try:
        meta = _decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass
        raise ValueError(f"malformed metadata: {exc}") from None
    if not math.isfinite(meta.created_at) or (
        meta.expires_at is not None and not math.isfinite(meta.expires_at)
    ):
        raise ValueError("malformed metadata: non-finite timestamp")
    return meta


def principal_dir_name(principal: str) -> str:
    """The directory of a principal: ``p_<hex>`` as is, ``local`` as ``p_local``."""
    return principal if principal.startswith("p_") else "p_" + principal


def principal_from_dir_name(name: str) -> str | None:
    """Inverse of :func:`principal_dir_name`; ``None`` for a name that is no principal's."""
    principal = "local" if name == "p_local" else name
    return principal if PRINCIPAL_PATTERN.fullmatch(principal) else None


class StoredState(msgspec.Struct, frozen=True, kw_only=True):
    """One published state as the catalog sees it. Never contains a path or a handle."""

    id: str
    principal: str
    envelope: Envelope
    model: str
    backend: str
    tier: Tier
    fingerprint: str
    created_at: float
    expires_at: float | None
    pinned: bool
    logical_bytes: int | None
    payload_bytes: int
    payload_sha256: str
    last_accessed_at: float | None
    prefixes: tuple[str, ...] = ()
    origin: str | None = None

    @classmethod
    def from_metadata(
        cls, meta: StateMetadata, *, pinned: bool, last_accessed_at: float | None
    ) -> StoredState:
        return cls(
            id=meta.id,
            principal=meta.principal,
            envelope=meta.envelope,
            model=meta.model,
            backend=meta.backend,
            tier=meta.tier,
            fingerprint=meta.fingerprint,
            created_at=meta.created_at,
            expires_at=meta.expires_at,
            pinned=pinned,
            logical_bytes=meta.logical_bytes,
            payload_bytes=meta.payload_bytes,
            payload_sha256=meta.payload_sha256,
            last_accessed_at=last_accessed_at,
            prefixes=meta.prefixes,
            origin=meta.origin,
        )

    def expired(self, now: float) -> bool:
        """TTL is the stronger boundary: an expired state is unavailable even when pinned."""
        return self.expires_at is not None and now >= self.expires_at

    def summary(
        self, *, reusable: bool, now: float | None = None, reason: str | None = None
    ) -> StateSummary:
        """The protocol view. ``reusable`` comes from the caller (it needs the live runtime's
        envelope); with ``now`` an expired state reports ``expired`` and is never reusable."""
        expired = now is not None and self.expired(now)
        return StateSummary(
            id=self.id,
            model=self.model,
            backend=self.backend,
            tier=self.tier,
            status=StateStatus.EXPIRED if expired else StateStatus.READY,
            logical_bytes=self.logical_bytes,
            created_at=rfc3339(self.created_at),
            last_accessed_at=(
                None if self.last_accessed_at is None else rfc3339(self.last_accessed_at)
            ),
            expires_at=None if self.expires_at is None else rfc3339(self.expires_at),
            pinned=self.pinned,
            reusable=reusable and not expired,
            reusable_reason=(
                "the state expired"
                if expired
                else None
                if reusable
                else reason or "no loaded runtime can reuse it"
            ),
        )
