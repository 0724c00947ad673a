"""The in-memory prefill → decode handoff registry, and the completion-text bound.

Seed, "Prefill/decode handoff": *"Prefill produces an opaque random handoff, not serialized KV
data. The server stores only a hash as the lookup key, binds the record to the authenticated
principal and the exact compatibility/process identity, and expires it after 15 minutes. The
in-memory registry allows at most 128 live handoffs per principal and 1024 live handoffs in total.
It purges expired records before checking either bound; at capacity it rejects issuance with
retryable resource_exhausted and never evicts a still-valid handoff."*

Every record occupies one **slot** through its whole life, and both bounds count slots:

* ``reserve`` takes a slot before any backend or persistence work (:class:`Reservation`);
  ``issue`` turns it into a live handoff, ``rollback`` (or leaving the ``with`` block without
  issuing) frees it — *"This prevents successful state creation followed by a late
  registry-capacity failure."*
* ``consume`` atomically removes the live handoff and keeps its slot *held*
  (:class:`ConsumedHandoff`) — *"Decode consumes the handoff before calling the backend. It is
  therefore single-use even when decoding fails"* — so a replacement token can be issued into
  the same slot (``replace``) and another request cannot steal it; ``release`` (or leaving the
  ``with`` block without replacing) frees it.

A slot that is never settled (a reservation neither issued nor rolled back, a hold neither
replaced nor released) lapses after :data:`HANDOFF_TTL_SECONDS` like an expired handoff, so a bug
cannot leak capacity forever. Settling a lapsed slot re-admits it under the normal bounds.

The clock is injected (``clock``, seconds since the epoch; ``time.time`` by default) so expiry
is testable without sleeping. A record is valid while ``clock() < expires_at``.
"""

from __future__ import annotations

import enum
import hmac
import itertools
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple, Self

from ..protocol.base import rfc3339
from ..protocol.errors import BackendError, InternalError, InvalidHandoff, ResourceExhausted
from ..protocol.prefill import MAX_COMPLETION_BYTES, Handoff
from .envelope import Envelope
from .principals import NamespaceKey, handoff_hash, is_principal

__all__ = [
    "HANDOFF_TTL_SECONDS",
    "MAX_LIVE_PER_PRINCIPAL",
    "MAX_LIVE_TOTAL",
    "TOKEN_PREFIX",
    "CompletionBuffer",
    "ConsumedHandoff",
    "HandoffBinding",
    "HandoffRegistry",
    "IssuedHandoff",
    "Reservation",
    "bound_completion_text",
]

HANDOFF_TTL_SECONDS = 15 * 60
MAX_LIVE_PER_PRINCIPAL = 128
MAX_LIVE_TOTAL = 1024
TOKEN_PREFIX = "wh_"  # noqa: S105 - a public prefix, not a secret

_INVALID = "handoff is unknown, expired, already used, or not valid for this caller"
"""The one message for every consume failure: it never reveals which case applied."""


@dataclass(frozen=True, kw_only=True)
class HandoffBinding:
    """What a handoff is bound to.

    :ivar envelope: the exact compatibility envelope of the runtime that produced the prefix,
        including its principal and process generation.
    :ivar payload: an opaque reference for decode (the backend state object, ...). Never
        inspected by the registry.
    :ivar state_id: the named state this handoff continues from, if any (``st_…``), so prune
        can skip states with a live handoff.
    """

    envelope: Envelope
    payload: Any = field(repr=False)
    state_id: str | None = None


class IssuedHandoff(NamedTuple):
    """A freshly issued handoff: ``token, expires_at = reservation.issue(binding)``.

    The token is shown exactly once (in the prefill or decode response); ``repr`` redacts it.
    """

    token: str
    expires_at: float

    def __repr__(self) -> str:
        return f"IssuedHandoff(token=<redacted>, expires_at={self.expires_at!r})"

    def to_protocol(self) -> Handoff:
        """The wire shape, with ``expires_at`` as an RFC 3339 UTC string."""
        return Handoff(token=self.token, expires_at=rfc3339(self.expires_at))


class _Phase(enum.Enum):
    RESERVED = "reserved"
    LIVE = "live"
    HELD = "held"


@dataclass(kw_only=True, eq=False)
class _Slot:
    principal: str
    phase: _Phase
    expires_at: float
    digest: str | None = None
    binding: HandoffBinding | None = None


class HandoffRegistry:
    """Bounded, thread-safe, in-memory handoff records (see the module docstring).

    :param key: keys the token hashes; an in-memory key by default (records never persist).
    :param clock: seconds since the epoch.
    :param ttl_seconds, max_per_principal, max_total: the seed's bounds; override only in tests.
    """

    def __init__(
        self,
        key: NamespaceKey | None = None,
        *,
        clock: Callable[[], float] = time.time,
        ttl_seconds: float = HANDOFF_TTL_SECONDS,
        max_per_principal: int = MAX_LIVE_PER_PRINCIPAL,
        max_total: int = MAX_LIVE_TOTAL,
    ) -> None:
        if ttl_seconds <= 0 or max_per_principal < 1 or max_total < 1:
            raise ValueError("handoff bounds must be positive")
        self._key = key if key is not None else NamespaceKey.ephemeral()
        self._clock = clock
        self._ttl = ttl_seconds
        self._max_principal = max_per_principal
        self._max_total = max_total
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._slots: dict[int, _Slot] = {}
        self._by_digest: dict[str, int] = {}
        self._per_principal: Counter[str] = Counter()
        self._events: Counter[str] = Counter()

    def event_counts(self) -> dict[str, int]:
        """Handoffs ``issued``, ``redeemed`` (consumed for a decode), ``expired`` (unused) and
        ``rejected`` (a token that was not a live handoff of the caller), since start."""
        with self._lock:
            self._purge()
            return {e: self._events[e] for e in ("issued", "redeemed", "expired", "rejected")}

    # --- issuance ---------------------------------------------------------------------------

    def reserve(self, principal: str) -> Reservation:
        """Take a slot for a prefill about to start.

        :raises werk.ResourceExhausted: (429, retryable) either bound is reached after purging
            expired records. No valid record is ever evicted.
        """
        _check_principal(principal)
        with self._lock:
            slot_id = self._admit(principal, _Phase.RESERVED)
        return Reservation(self, slot_id, principal)

    # --- decode -----------------------------------------------------------------------------

    def consume(
        self, principal: str, token: str, *, generation: str | AbstractSet[str]
    ) -> ConsumedHandoff:
        """Atomically take the live handoff ``token`` for ``principal``, before decode runs.

        ``generation`` is the live process generation (or the set of live generations) the
        record must be bound to. After this call the token is spent, whatever decode does next.

        :raises werk.InvalidHandoff: unknown, expired, already consumed, owned by another
            principal, or bound to another process generation — one message for all cases.
        """
        live = {generation} if isinstance(generation, str) else generation
        digest = handoff_hash(self._key, token)
        with self._lock:
            self._purge()
            slot_id = self._by_digest.get(digest)
            slot = self._slots.get(slot_id) if slot_id is not None else None
            if (
                slot is None
                or slot_id is None
                or slot.phase is not _Phase.LIVE
                or slot.digest is None
                or slot.binding is None
                or not hmac.compare_digest(slot.digest, digest)
                or not hmac.compare_digest(slot.principal.encode(), principal.encode())
            ):
                self._events["rejected"] += 1
                raise InvalidHandoff(_INVALID)
            del self._by_digest[digest]
            slot.digest = None
            if slot.binding.envelope.generation not in live:
                # A generation never comes back: the record is dead for good, free its slot.
                self._free(slot_id)
                self._events["rejected"] += 1
                raise InvalidHandoff(_INVALID)
            self._events["redeemed"] += 1
            slot.phase = _Phase.HELD
            slot.expires_at = self._clock() + self._ttl
            binding = slot.binding  # kept on the held slot: prune sees the state as in use
        return ConsumedHandoff(self, slot_id, principal, binding)

    # --- queries (no side effects) ----------------------------------------------------------

    def live_for(self, principal: str, state_id: str) -> bool:
        """Whether a live or in-use (consumed, decode running) handoff continues ``state_id``."""
        return state_id in self.live_state_ids(principal)

    def live_state_ids(self, principal: str) -> frozenset[str]:
        """Every state id of ``principal`` with a live or in-use handoff (for prune's skips)."""
        with self._lock:
            now = self._clock()
            return frozenset(
                slot.binding.state_id
                for slot in self._slots.values()
                if slot.principal == principal
                and now < slot.expires_at
                and slot.binding is not None
                and slot.binding.state_id is not None
            )

    def generations_in_use(self) -> frozenset[str]:
        """Generations a live or in-use handoff is bound to (such a runtime must not be
        unloaded for being idle: its handoff would die with it)."""
        with self._lock:
            now = self._clock()
            return frozenset(
                slot.binding.envelope.generation
                for slot in self._slots.values()
                if now < slot.expires_at and slot.binding is not None
            )

    def occupied(self, principal: str | None = None) -> int:
        """Slots counted against the bounds right now (expired ones excluded)."""
        with self._lock:
            now = self._clock()
            return sum(
                1
                for slot in self._slots.values()
                if now < slot.expires_at and (principal is None or slot.principal == principal)
            )

    # --- lifecycle --------------------------------------------------------------------------

    def drop_generation(self, generation: str) -> int:
        """Drop every live handoff bound to ``generation`` (its process exited). Returns how many.

        Reservations and holds are left to their owners, who settle them.
        """
        return self._drop(lambda g: g == generation)

    def drop_generations(self, live: AbstractSet[str]) -> int:
        """Drop every live handoff whose generation is *not* in ``live``. Returns how many."""
        return self._drop(lambda g: g not in live)

    def _drop(self, dead: Callable[[str], bool]) -> int:
        with self._lock:
            doomed = [
                slot_id
                for slot_id, slot in self._slots.items()
                if slot.phase is _Phase.LIVE
                and slot.binding is not None
                and dead(slot.binding.envelope.generation)
            ]
            for slot_id in doomed:
                self._free(slot_id)
            return len(doomed)

    # --- internals (call with the lock held) ------------------------------------------------

    def _purge(self) -> None:
        now = self._clock()
        for slot_id in [i for i, slot in self._slots.items() if now >= slot.expires_at]:
            if self._slots[slot_id].phase is _Phase.LIVE:
                self._events["expired"] += 1
            self._free(slot_id)

    def _admit(self, principal: str, phase: _Phase) -> int:
        self._purge()
        if self._per_principal[principal] >= self._max_principal:
            raise ResourceExhausted(
                f"this principal already has {self._max_principal} live handoffs; "
                "retry after one is used or expires"
            )
        if len(self._slots) >= self._max_total:
            raise ResourceExhausted(
                f"the handoff registry is full ({self._max_total} live handoffs); retry later"
            )
        slot_id = next(self._ids)
        self._slots[slot_id] = _Slot(
            principal=principal, phase=phase, expires_at=self._clock() + self._ttl
        )
        self._per_principal[principal] += 1
        return slot_id

    def _free(self, slot_id: int) -> None:
        slot = self._slots.pop(slot_id)
        if slot.digest is not None:
            self._by_digest.pop(slot.digest, None)
        self._per_principal[slot.principal] -= 1
        if self._per_principal[slot.principal] <= 0:
            del self._per_principal[slot.principal]

    def _settle(
        self, slot_id: int, principal: str, expected: _Phase, binding: HandoffBinding | None
    ) -> IssuedHandoff | None:
        """Turn a reserved/held slot into a live handoff (``binding``) or free it (``None``)."""
        with self._lock:
            self._purge()
            slot = self._slots.get(slot_id)
            if slot is not None and slot.phase is not expected:
                raise InternalError("handoff slot settled twice")
            if binding is None:
                if slot is not None:
                    self._free(slot_id)
                return None
            if slot is None:  # the slot lapsed while unsettled: re-admit under the bounds
                slot_id = self._admit(principal, expected)
                slot = self._slots[slot_id]
            token = TOKEN_PREFIX + secrets.token_urlsafe(32)
            digest = handoff_hash(self._key, token)
            slot.phase = _Phase.LIVE
            slot.digest = digest
            slot.binding = binding
            slot.expires_at = self._clock() + self._ttl
            self._by_digest[digest] = slot_id
            self._events["issued"] += 1
            return IssuedHandoff(token, slot.expires_at)


def _check_principal(principal: str) -> None:
    if not is_principal(principal):
        raise ValueError("not a principal id")


def _check_binding(principal: str, binding: HandoffBinding) -> None:
    if binding.envelope.principal != principal:
        raise InternalError("a handoff must be bound to its own principal's envelope")


class _Settlement:
    """Shared once-only bookkeeping of :class:`Reservation` and :class:`ConsumedHandoff`."""

    _phase: _Phase

    def __init__(self, registry: HandoffRegistry, slot_id: int, principal: str) -> None:
        self._registry = registry
        self._slot_id = slot_id
        self.principal = principal
        self._settled = False

    @property
    def settled(self) -> bool:
        return self._settled

    def _take(self, binding: HandoffBinding | None) -> IssuedHandoff | None:
        if self._settled:
            raise InternalError("handoff slot settled twice")
        if binding is not None:
            _check_binding(self.principal, binding)
        result = self._registry._settle(self._slot_id, self.principal, self._phase, binding)
        self._settled = True
        return result

    def _free_if_unsettled(self) -> None:
        if not self._settled:
            self._take(None)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._free_if_unsettled()


class Reservation(_Settlement):
    """A slot reserved for one prefill. Issue exactly once, or roll back.

    As a context manager it rolls back on exit unless :meth:`issue` was called, so an exception
    anywhere in the prefill frees the slot.
    """

    _phase = _Phase.RESERVED

    def issue(self, binding: HandoffBinding) -> IssuedHandoff:
        """Turn the reservation into a live handoff; returns the token (shown once) and expiry."""
        issued = self._take(binding)
        assert issued is not None
        return issued

    def rollback(self) -> None:
        """Free the slot (prefill failed). A no-op after :meth:`issue` or a prior rollback."""
        self._free_if_unsettled()


class ConsumedHandoff(_Settlement):
    """A consumed handoff whose slot is held during decode.

    :ivar binding: what the handoff was bound to (envelope, opaque payload, state id).

    As a context manager it releases the slot on exit unless :meth:`replace` was called.
    """

    _phase = _Phase.HELD

    def __init__(
        self, registry: HandoffRegistry, slot_id: int, principal: str, binding: HandoffBinding
    ) -> None:
        super().__init__(registry, slot_id, principal)
        self.binding = binding

    def replace(self, binding: HandoffBinding) -> IssuedHandoff:
        """Issue the replacement token (decode returned an updated state) into the held slot."""
        issued = self._take(binding)
        assert issued is not None
        return issued

    def release(self) -> None:
        """Free the held slot (no replacement). A no-op once settled."""
        self._free_if_unsettled()


# --- completion text bound ------------------------------------------------------------------


def _too_large(limit: int) -> BackendError:
    return BackendError(f"the backend returned more than {limit} bytes of completion text")


def _utf8_length(text: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BackendError("the backend returned text that is not valid Unicode") from None


def bound_completion_text(text: str, *, limit: int = MAX_COMPLETION_BYTES) -> str:
    """Return ``text`` if its UTF-8 encoding is at most ``limit`` bytes (1 MiB).

    :raises werk.BackendError: (502) over the bound, or not encodable as UTF-8.
    """
    # Every character takes at least one byte: a string longer than the limit in characters is
    # over it in bytes, without encoding it.
    if len(text) > limit or _utf8_length(text) > limit:
        raise _too_large(limit)
    return text


class CompletionBuffer:
    """Accumulates streamed completion chunks; never holds more than ``limit`` UTF-8 bytes.

    :meth:`append` raises as soon as a chunk would cross the bound; the chunk is not stored and
    the buffer refuses every later chunk.
    """

    def __init__(self, *, limit: int = MAX_COMPLETION_BYTES) -> None:
        self._limit = limit
        self._chunks: list[str] = []
        self._bytes = 0
        self._failed = False

    @property
    def byte_length(self) -> int:
        return self._bytes

    def append(self, chunk: str) -> None:
        """Add ``chunk``. :raises werk.BackendError: the total would exceed the bound."""
        if self._failed:
            raise _too_large(self._limit)
        room = self._limit - self._bytes
        if len(chunk) > room or (size := _utf8_length(chunk)) > room:
            self._failed = True
            raise _too_large(self._limit)
        self._chunks.append(chunk)
        self._bytes += size

    def extend(self, chunks: Iterable[str]) -> None:
        for chunk in chunks:
            self.append(chunk)

    def text(self) -> str:
        return "".join(self._chunks)
