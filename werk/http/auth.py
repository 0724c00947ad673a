"""Authentication: API key → opaque principal, compared in constant time.

The raw key never leaves this module: handlers receive only the principal (``p_<hex>``, an
HMAC of the key under the namespace key) or ``local`` in unauthenticated local mode.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence

from ..protocol import AuthMode, Unauthenticated
from .links import OutputLinks
from .sessions import SessionSigner

__all__ = ["Authenticator"]

LOCAL_PRINCIPAL = "local"


class Authenticator:
    """Checks ``Authorization: Bearer <key>`` against the configured keys.

    :param api_keys: the accepted keys; empty means unauthenticated local mode.
    :param derive_principal: maps an accepted key to its principal (HMAC under the namespace key).
    :param link_secret: the secret output links and dashboard sessions are signed under (from
        the namespace key, so both outlive a restart); ``None``: a random one for this process.
    :param loopback_hosts_only: in unauthenticated mode, refuse requests whose ``Host`` is not a
        loopback name (DNS-rebinding defence). Only ``--insecure-no-auth`` on a non-loopback
        bind turns it off, since such a server is meant to be reached by other names.
    """

    def __init__(
        self,
        api_keys: Sequence[str],
        derive_principal: Callable[[str], str],
        *,
        loopback_hosts_only: bool = True,
        link_secret: bytes | None = None,
    ) -> None:
        self._keys = [(key.encode(), derive_principal(key)) for key in api_keys if key]
        self.links = OutputLinks(link_secret)
        self.sessions = SessionSigner(link_secret, (principal for _, principal in self._keys))
        self.mode = AuthMode.API_KEY if self._keys else AuthMode.UNAUTHENTICATED_LOCAL
        self.loopback_hosts_only = loopback_hosts_only

    def principal(self, authorization: str | None) -> str:
        """The caller's principal.

        :raises Unauthenticated: keys are configured and the header is missing or wrong.
        """
        if self.mode is AuthMode.UNAUTHENTICATED_LOCAL:
            return LOCAL_PRINCIPAL
        scheme, _, presented = (authorization or "").partition(" ")
        candidate = presented.strip().encode()
        match: str | None = None
        for key, principal in self._keys:  # no early exit: time does not depend on which key
            if hmac.compare_digest(candidate, key) and scheme.lower() == "bearer":
                match = principal
        if match is None:
            raise Unauthenticated("missing or invalid API key")
        return match
