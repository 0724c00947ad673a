"""Per-request admission: the Host and Origin checks (DNS rebinding, cross-site requests) and
authentication by API key or dashboard session cookie."""

from __future__ import annotations

import base64
import binascii
import functools
import ipaddress
from typing import TYPE_CHECKING

from ..protocol import AuthMode, InvalidRequest
from .auth import Authenticator
from .headers import header
from .sessions import SESSION_COOKIE

if TYPE_CHECKING:  # not at run time: `werk serve` checks its bind address before starlette loads
    from starlette.requests import HTTPConnection

__all__ = ["admit", "admit_tool_client", "check_host", "check_origin", "is_loopback_host"]

_LOOPBACK_NAMES = {"localhost", "localhost.", "ip6-localhost"}


@functools.lru_cache(maxsize=256)  # a client sends the same Host with every request
def is_loopback_host(host: str) -> bool:
    """Whether ``host`` (a Host header value or bind address, port allowed) is loopback."""
    value = host.strip().lower()
    if value.startswith("["):  # [::1]:port
        value = value[1:].split("]", 1)[0]
    elif value.count(":") == 1:  # name:port or v4:port
        value = value.rsplit(":", 1)[0]
    if value in _LOOPBACK_NAMES or value.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(value).is_loopback
    except ValueError:
        return False


def check_host(request: HTTPConnection, auth: Authenticator) -> None:
    """In unauthenticated local mode refuse a request whose ``Host`` is not a loopback name or
    address: a web page that rebinds its DNS name to 127.0.0.1 must not reach the server."""
    if auth.mode is AuthMode.UNAUTHENTICATED_LOCAL and auth.loopback_hosts_only:
        host = header(request, b"host") or ""
        if not is_loopback_host(host):
            raise InvalidRequest(
                "Host header is not a loopback name; unauthenticated local mode serves only "
                "loopback clients (configure an API key to serve other names)"
            )


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def check_origin(request: HTTPConnection, *, required: bool) -> None:
    """Refuse a request a browser sent from another origin: its ``Origin`` header must name
    this server as the request's ``Host`` does. ``required``: a request without ``Origin`` is
    refused too (a state-changing request a browser authenticated by cookie always has one)."""
    origin = header(request, b"origin")
    if origin is None:
        if required:
            raise InvalidRequest("this request needs an Origin header naming this server")
        return
    _, sep, authority = origin.partition("://")
    host = header(request, b"host") or ""
    if not sep or not host or authority.rstrip("/").lower() != host.lower():
        raise InvalidRequest(
            "the request's Origin is not this server; cross-site requests are refused"
        )


def admit(request: HTTPConnection, auth: Authenticator) -> str:
    """Return the caller's principal or raise.

    * :func:`check_host` (unauthenticated local mode).
    * An ``Authorization: Bearer`` key decides when present (scripts, SDKs).
    * Without one, a dashboard session cookie (:mod:`werk.http.sessions`) does; its request
      must come from this server's own origin (:func:`check_origin`), and a state-changing one
      must say so.
    * In unauthenticated local mode a request from a foreign origin is refused: a page on
      another site must not drive a loopback server that asks for no key.

    The principal is recorded in the request scope (``werk_principal``) for the activity tail.
    """
    check_host(request, auth)
    authorization = header(request, b"authorization")
    if auth.mode is AuthMode.UNAUTHENTICATED_LOCAL:
        check_origin(request, required=False)
        principal = auth.principal(authorization)
    elif authorization is None and SESSION_COOKIE in request.cookies:
        check_origin(request, required=request.scope.get("method", "GET") not in _SAFE_METHODS)
        principal = auth.sessions.principal(request.cookies[SESSION_COOKIE])
    else:
        principal = auth.principal(authorization)
    request.scope["werk_principal"] = principal
    return principal


def admit_tool_client(request: HTTPConnection, auth: Authenticator) -> str:
    """:func:`admit` for the routes existing image tools call (AUTOMATIC1111's, ComfyUI's):
    besides ``Authorization: Bearer KEY`` they send HTTP Basic with the key as the password
    (Open WebUI, SillyTavern), and an empty ``Authorization`` header when none is configured
    (accepted in unauthenticated local mode, as any header is)."""
    authorization = header(request, b"authorization") or ""
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() != "basic" or auth.mode is AuthMode.UNAUTHENTICATED_LOCAL:
        return admit(request, auth)
    check_host(request, auth)
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        decoded = ""
    principal = auth.principal("Bearer " + decoded.partition(":")[2])
    request.scope["werk_principal"] = principal
    return principal
