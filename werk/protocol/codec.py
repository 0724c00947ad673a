"""The one JSON encoder/decoder pair every wire shape goes through.

:func:`decode` turns every decoding failure into :class:`werk.InvalidRequest` naming the
offending path, never echoing the body.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from .errors import InvalidRequest

__all__ = ["decode", "encode", "to_builtins"]

_T = TypeVar("_T")

_encoder = msgspec.json.Encoder()
_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}
"""One decoder per target type: ``msgspec.json.decode(data, type=…)`` builds the type's
decoding plan on every call, which for ``dict[str, Any]`` cost more than decoding a short
request body. The types are the code's own, so the dictionary stays small."""


def encode(value: Any) -> bytes:
    """Encode any Struct (or builtin) to compact JSON bytes."""
    return _encoder.encode(value)


def decode(data: bytes | str, type: type[_T]) -> _T:
    """Decode JSON into ``type``, raising :class:`werk.InvalidRequest` on any error.

    The message names the offending path (``$.policy.ttl_seconds``) but never echoes the body.
    """
    decoder = _decoders.get(type)
    if decoder is None:
        decoder = _decoders[type] = msgspec.json.Decoder(type)
    try:
        return decoder.decode(data)  # type: ignore[no-any-return]
    except msgspec.ValidationError as exc:
        raise InvalidRequest(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("malformed JSON: nesting is too deep") from None


def to_builtins(value: Any) -> Any:
    """Convert a Struct to plain dicts/lists (for tables and tests)."""
    return msgspec.to_builtins(value)
