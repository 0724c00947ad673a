"""Shared Struct bases and the protocol's timestamp form (the JSON codec is :mod:`.codec`).

* :class:`Request` rejects unknown fields: a typo must never silently weaken a policy.
* :class:`Response` tolerates unknown fields, so older clients keep decoding newer servers.

Both are frozen and keyword-only. New fields are only ever added with a default; an existing
field's type never changes.
"""

from __future__ import annotations

import datetime as _dt

import msgspec

__all__ = ["Request", "Response", "rfc3339"]


class Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every client → server body. Unknown fields are a decode error."""


class Response(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    """Base of every server → client body. Unknown fields are ignored when decoding."""


def rfc3339(epoch_seconds: float) -> str:
    """The protocol's timestamp form: RFC 3339 UTC with milliseconds, ``…T14:32:21.123Z``."""
    moment = _dt.datetime.fromtimestamp(epoch_seconds, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
