"""One request header, read straight from the ASGI scope.

Starlette's ``request.headers.get(name)`` builds a ``Headers`` view, lowercases and encodes the
name, and raises and catches a ``KeyError`` for a header that is absent (``Origin`` and
``Authorization`` usually are); admission and body reading ask for five headers on every
request. ASGI servers give header names in lowercase (uvicorn does), as Starlette's lookup
assumes too; the first of repeated headers wins, as there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # no starlette at run time (see werk.http.guard)
    from starlette.requests import HTTPConnection

__all__ = ["header"]


def header(connection: HTTPConnection, name: bytes) -> str | None:
    """The first value of the header ``name`` (lowercase), or ``None`` when absent."""
    pairs: list[tuple[bytes, bytes]] = connection.scope["headers"]
    for key, value in pairs:
        if key == name:
            return value.decode("latin-1")
    return None
