"""Shared Struct bases and the one JSON encoder/decoder pair every wire shape goes through.

* :class:`Request` rejects unknown fields: a typo must never silently weaken a policy.
* :class:`Response` tolerates unknown fields, so older clients keep decoding newer servers.

Both are frozen and keyword-only. New fields are only ever added with a default; an existing
field's type never changes.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, TypeVar

import msgspec

__all__ = ["Request", "Response", "decode", "encode", "rfc3339", "to_builtins"]


class Request(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every client → server body. Unknown fields are a decode error."""


class Response(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=False):
    """Base of every server → client body. Unknown fields are ignored when decoding."""


_T = TypeVar("_T")

_encoder = msgspec.json.Encoder()


def encode(value: Any) -> bytes:
    """Encode any Struct (or builtin) to compact JSON bytes."""
    return _encoder.encode(value)


def decode(data: bytes | str, type: type[_T]) -> _T:
    """Decode JSON into ``type``, raising :class:`werk.InvalidRequest` on any error.

    The message names the offending path (``$.policy.ttl_seconds``) but never echoes the body.
    """
    from .errors import InvalidRequest

    try:
        return msgspec.json.decode(data, type=type)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("malformed JSON: nesting is too deep") from None


def to_builtins(value: Any) -> Any:
    """Convert a Struct to plain dicts/lists (for tables and tests)."""
    return msgspec.to_builtins(value)


def rfc3339(epoch_seconds: float) -> str:
    """The protocol's timestamp form: RFC 3339 UTC with milliseconds, ``…T14:32:21.123Z``."""
    moment = _dt.datetime.fromtimestamp(epoch_seconds, tz=_dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
