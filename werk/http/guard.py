"""Per-request admission: Host-header check (DNS rebinding) and authentication."""

from __future__ import annotations

import functools
import ipaddress
from typing import TYPE_CHECKING

from ..protocol import AuthMode, InvalidRequest
from .auth import Authenticator

if TYPE_CHECKING:  # not at run time: `werk serve` checks its bind address before starlette loads
    from starlette.requests import Request

__all__ = ["admit", "is_loopback_host"]

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


def admit(request: Request, auth: Authenticator) -> str:
    """Return the caller's principal or raise.

    In unauthenticated local mode a request whose ``Host`` is not a loopback name or address is
    refused: a web page that rebinds its DNS name to 127.0.0.1 must not reach the server.
    """
    if auth.mode is AuthMode.UNAUTHENTICATED_LOCAL and auth.loopback_hosts_only:
        host = request.headers.get("host", "")
        if not is_loopback_host(host):
            raise InvalidRequest(
                "Host header is not a loopback name; unauthenticated local mode serves only "
                "loopback clients (configure an API key to serve other names)"
            )
    return auth.principal(request.headers.get("authorization"))
