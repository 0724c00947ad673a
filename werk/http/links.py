"""Signed, expiring download links for job outputs.

An output (``/v1/outputs/{id}``) is private to the API key whose job produced it. A browser,
``<img src>``, ``curl`` or a chat UI cannot send an ``Authorization`` header, so every output
URL Werk answers with is absolute (built from the request's own scheme and ``Host``) and
carries a signature that grants exactly that output to exactly that principal until it
expires::

    http://127.0.0.1:11434/v1/outputs/out_…?principal=p_…&expires=1765000000&signature=…

The signature is HMAC-SHA256 over the principal, the output id and the expiry, under a key
derived from the server's namespace key (so links survive a restart and die with the key's
rotation). A request with a valid, unexpired link needs no API key; a wrong or expired one is
``401``. The link names the principal (a keyed hash, not the API key) and no other output.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import urlencode

from starlette.requests import Request

from ..protocol import Unauthenticated

__all__ = ["OUTPUT_LINK_SECONDS", "OutputLinks"]

OUTPUT_LINK_SECONDS = 3600
"""How long a signed output link is valid."""

_OUTPUTS = "/v1/outputs/"


class OutputLinks:
    """Signs and checks output links (one per server; ``secret`` from the namespace key)."""

    def __init__(
        self,
        secret: bytes | None = None,
        *,
        lifetime: int = OUTPUT_LINK_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        seed = secret if secret is not None else secrets.token_bytes(32)
        self._key = hmac.new(seed, b"werk output links v1", hashlib.sha256).digest()
        self.lifetime = lifetime
        self._clock = clock

    def _signature(self, principal: str, output_id: str, expires: int) -> str:
        message = f"{principal}\n{output_id}\n{expires}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def absolute(self, request: Request, principal: str, url: str) -> str:
        """``url`` (an output's relative ``/v1/outputs/{id}``) as an absolute, signed link;
        any other URL is returned unchanged."""
        if not url.startswith(_OUTPUTS):
            return url
        output_id = url[len(_OUTPUTS) :]
        expires = int(self._clock()) + self.lifetime
        query = urlencode(
            {
                "principal": principal,
                "expires": expires,
                "signature": self._signature(principal, output_id, expires),
            }
        )
        base = str(request.base_url).rstrip("/")
        return f"{base}{url}?{query}"

    def principal(self, request: Request, output_id: str) -> str | None:
        """The principal a signed link grants ``output_id`` to; ``None`` when the request
        carries no link (then the API key decides).

        :raises Unauthenticated: the link is malformed, forged, or expired.
        """
        query = request.query_params
        if not any(name in query for name in ("principal", "expires", "signature")):
            return None
        principal = query.get("principal", "")
        expires_text = query.get("expires", "")
        signature = query.get("signature", "")
        if not (principal and expires_text.isdigit() and signature):
            raise Unauthenticated("the output link is incomplete")
        expires = int(expires_text)
        expected = self._signature(principal, output_id, expires)
        if not hmac.compare_digest(expected.encode(), signature.encode()):
            raise Unauthenticated("the output link's signature is not valid")
        if expires < self._clock():
            raise Unauthenticated(
                "the output link has expired; read the job again (GET /v1/jobs/{id}) for a "
                "fresh one"
            )
        return principal
