"""Browser sessions for the dashboard: an API key posted once becomes a signed cookie.

A browser cannot keep an API key anywhere safe (a URL, the page or ``localStorage`` all leak
it), so the dashboard's sign-in posts the key once and Werk answers with a session cookie::

    Set-Cookie: werk_session=<payload>.<signature>; HttpOnly; SameSite=Strict; Path=/; Max-Age=43200

The payload names the principal (a keyed hash, never the key), an expiry and a random nonce;
the signature is HMAC-SHA256 under a key derived from the server's namespace secret *and the
set of accepted keys*: restarting with a different key set revokes every session at once, and
a cookie of a key that is gone no longer matches any accepted principal. JavaScript cannot read
the cookie (``HttpOnly``); other sites cannot make the browser send it (``SameSite=Strict``);
requests it authenticates must come from the page's own origin (:func:`werk.http.guard.admit`
checks ``Origin``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable, Iterable

import msgspec

from ..protocol import Unauthenticated

__all__ = ["SESSION_COOKIE", "SESSION_SECONDS", "SessionSigner"]

SESSION_COOKIE = "werk_session"
SESSION_SECONDS = 12 * 3600
"""How long a dashboard session lasts after sign-in."""

_MAX_COOKIE = 512


class _Payload(msgspec.Struct, frozen=True, array_like=True):
    principal: str
    expires: int
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class SessionSigner:
    """Issues and checks session cookie values (one per server).

    :param secret: the server's namespace-derived secret (``None``: a random one, so sessions
        end with the process).
    :param principals: the principals of the accepted keys; the signing key depends on them.
    """

    def __init__(
        self,
        secret: bytes | None,
        principals: Iterable[str],
        *,
        lifetime: int = SESSION_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._principals = frozenset(principals)
        seed = secret if secret is not None else secrets.token_bytes(32)
        material = b"werk dashboard sessions v1\n" + "\n".join(sorted(self._principals)).encode()
        self._key = hmac.new(seed, material, hashlib.sha256).digest()
        self.lifetime = lifetime
        self._clock = clock

    def _signature(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())

    def issue(self, principal: str) -> str:
        """A cookie value for ``principal``, valid for :attr:`lifetime` seconds."""
        expires = int(self._clock()) + self.lifetime
        payload = _b64(msgspec.json.encode(_Payload(principal, expires, secrets.token_hex(8))))
        return f"{payload}.{self._signature(payload)}"

    def principal(self, value: str) -> str:
        """The principal a cookie value was issued to.

        :raises Unauthenticated: the value is malformed, forged, expired, or its key is no
            longer accepted.
        """
        payload, dot, signature = value.partition(".")
        if not dot or len(value) > _MAX_COOKIE:
            raise Unauthenticated("the session cookie is not valid; sign in again")
        if not hmac.compare_digest(self._signature(payload).encode(), signature.encode()):
            raise Unauthenticated("the session cookie is not valid; sign in again")
        try:
            decoded = msgspec.json.decode(_unb64(payload), type=_Payload)
        except (ValueError, msgspec.DecodeError):
            raise Unauthenticated("the session cookie is not valid; sign in again") from None
        if decoded.expires < self._clock():
            raise Unauthenticated("the session has expired; sign in again")
        if decoded.principal not in self._principals:
            raise Unauthenticated("the session's API key is no longer accepted; sign in again")
        return decoded.principal
