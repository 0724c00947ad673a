"""Pages of a listing: ``limit`` and an opaque ``cursor``.

A listing ordered by a unique string key (a state id, a job id, a cache entry id) is cut into
pages: ``limit`` items at most, and ``next_cursor`` when more may follow. The cursor is opaque to
clients (base64url of the last key returned, with a version prefix); passing it back returns the
items after that key, so a page is stable under insertions and deletions elsewhere. A cursor
that does not decode is ``invalid_request``; an empty last page is possible when the remaining
items were filtered out.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import TypeVar

from .errors import InvalidRequest

__all__ = [
    "MAX_PAGE",
    "check_limit",
    "decode_cursor",
    "encode_cursor",
    "page_after",
    "parse_limit",
]

MAX_PAGE = 1000
"""The largest ``limit`` a listing accepts."""

_T = TypeVar("_T")
_PREFIX = "c1."


def encode_cursor(key: str) -> str:
    """The opaque cursor that resumes after ``key``."""
    return _PREFIX + base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    """The key a cursor resumes after (``None`` for none).

    :raises InvalidRequest: not a cursor this server issued.
    """
    if cursor is None:
        return None
    if not cursor.startswith(_PREFIX) or len(cursor) > 512:
        raise InvalidRequest("query parameter 'cursor' is not a cursor from a previous page")
    raw = cursor[len(_PREFIX) :]
    try:
        padded = raw + "=" * (-len(raw) % 4)
        return base64.b64decode(padded, altchars=b"-_", validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            "query parameter 'cursor' is not a cursor from a previous page"
        ) from None


def check_limit(limit: int | None) -> int | None:
    """``limit`` if it is 1..:data:`MAX_PAGE` (or ``None``: everything)."""
    if limit is not None and not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be 1 to {MAX_PAGE}")
    return limit


def parse_limit(value: str | None) -> int | None:
    """A ``limit`` query parameter: 1..:data:`MAX_PAGE` when present."""
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidRequest(f"query parameter 'limit' must be an integer 1 to {MAX_PAGE}")
    return check_limit(int(value))


def page_after(
    ordered: Iterable[_T], key: Callable[[_T], str], limit: int | None, after: str | None
) -> tuple[list[_T], str | None]:
    """The items of ``ordered`` (ascending by ``key``) after ``after``, ``limit`` at most, and
    the cursor of the next page (``None`` when this one holds the rest)."""
    items: list[_T] = []
    for item in ordered:
        if after is not None and key(item) <= after:
            continue
        if limit is not None and len(items) == limit:
            return items, encode_cursor(key(items[-1]))
        items.append(item)
    return items, None
