"""Argument checks for the catalog's public methods (``invalid_request`` on any violation).

The principal is always the server's derived id (``local`` or ``p_`` + 64 hex digits), never
client input; a malformed one is a caller bug and is refused rather than normalised.
"""

from __future__ import annotations

from ..protocol.errors import InvalidRequest
from ..protocol.policy import TTL_MAX_SECONDS, TTL_MIN_SECONDS
from ..protocol.states import Tier
from .envelope import Envelope
from .metadata import FINGERPRINT_PATTERN, PRINCIPAL_PATTERN

__all__ = ["check_commit", "check_fingerprint", "check_principal"]


def check_principal(principal: str) -> None:
    if not isinstance(principal, str) or not PRINCIPAL_PATTERN.fullmatch(principal):
        raise InvalidRequest("malformed principal id")


def check_fingerprint(fingerprint: str) -> None:
    if not isinstance(fingerprint, str) or not FINGERPRINT_PATTERN.fullmatch(fingerprint):
        raise InvalidRequest("malformed prompt fingerprint")


def check_commit(
    principal: str,
    *,
    envelope: Envelope,
    model: str,
    backend: str,
    tier: Tier,
    fingerprint: str,
    ttl_seconds: int | None,
    pinned: bool,
    logical_bytes: int | None,
) -> None:
    """Everything :meth:`~werk.state.catalog.StateCatalog.commit` records must be in range."""
    check_principal(principal)
    if not isinstance(envelope, Envelope) or envelope.principal != principal:
        raise InvalidRequest("the envelope must name the committing principal")
    for what, value in (("model", model), ("backend", backend)):
        if not isinstance(value, str) or not 1 <= len(value) <= 128:
            raise InvalidRequest(f"{what} must be 1..128 characters")
    if not isinstance(tier, Tier):
        raise InvalidRequest("tier must be a Tier")
    check_fingerprint(fingerprint)
    if ttl_seconds is not None and (
        type(ttl_seconds) is not int or not TTL_MIN_SECONDS <= ttl_seconds <= TTL_MAX_SECONDS
    ):
        raise InvalidRequest(f"ttl_seconds must be {TTL_MIN_SECONDS}..{TTL_MAX_SECONDS} or null")
    if type(pinned) is not bool:
        raise InvalidRequest("pinned must be a boolean")
    if logical_bytes is not None and (type(logical_bytes) is not int or logical_bytes < 0):
        raise InvalidRequest("logical_bytes must be a non-negative integer or null")
