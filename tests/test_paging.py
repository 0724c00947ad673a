"""``werk.protocol.paging``: pages cut by ``limit`` and an opaque cursor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from werk.protocol import InvalidRequest
from werk.protocol.paging import decode_cursor, encode_cursor, page_after, parse_limit


@given(st.text(max_size=200))
def test_a_cursor_resumes_after_its_key(key: str) -> None:
    assert decode_cursor(encode_cursor(key)) == key.encode("utf-8", "replace").decode()


@given(
    st.lists(st.text(min_size=1, max_size=8), unique=True, max_size=40),
    st.integers(min_value=1, max_value=50),
)
def test_pages_together_are_the_listing_each_item_once(keys: list[str], limit: int) -> None:
    ordered = sorted(keys)
    seen: list[str] = []
    after: str | None = None
    while True:
        page, cursor = page_after(ordered, lambda k: k, limit, after)
        assert len(page) <= limit
        seen += page
        if cursor is None:
            break
        assert len(page) == limit  # only a full page says there may be more
        after = decode_cursor(cursor)
    assert seen == ordered


@pytest.mark.parametrize("cursor", ["", "abc", "c1.!!", "c1." + "A" * 600, "c1.A"])
def test_a_foreign_cursor_is_refused(cursor: str) -> None:
    with pytest.raises(InvalidRequest, match="cursor"):
        decode_cursor(cursor)


@pytest.mark.parametrize("value", ["0", "1001", "-1", "x", "1.5", ""])
def test_a_limit_out_of_range_is_refused(value: str) -> None:
    with pytest.raises(InvalidRequest, match="limit"):
        parse_limit(value)


def test_a_limit_in_range_is_taken() -> None:
    assert parse_limit("1") == 1 and parse_limit("1000") == 1000 and parse_limit(None) is None
