"""``werk.sse.SSEDecoder``: the one SSE parser (the relay's and the terminal chat's)."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from werk.sse import EventTooLarge, SSEDecoder

WIRE = (
    b': comment\r\ndata: {"a":1}\r\n\r\nevent: x\ndata: line1\ndata:line2\nid: 7\n\n'
    b'event: error\ndata: {"code":500}\n\nevent: error\ndata: {"error":{"code":1}}\n\n'
    b"retry: 5\ndata: [DONE]\n\n"
)
EVENTS = [
    b'{"a":1}',
    b"line1\nline2",
    b'{"error":{"code":500}}',  # an error event's data is handed out as an error object
    b'{"error":{"code":1}}',  # ... unless it is one already
    b"[DONE]",
]


def decode(chunks: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    return [event for chunk in chunks for event in decoder.feed(chunk)]


@given(st.lists(st.integers(min_value=0, max_value=len(WIRE)), max_size=12))
def test_events_are_the_same_wherever_the_bytes_are_split(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(WIRE)]
    chunks = [WIRE[a:b] for a, b in pairwise(points)]
    assert decode(chunks) == EVENTS


def test_the_end_hands_out_only_an_event_whose_data_line_was_complete_or_unterminated() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.end() == [b"[DONE]"]
    assert decoder.end() == []
    assert SSEDecoder().end() == []


def test_an_event_or_a_line_past_the_bound_is_refused_before_it_is_buffered_whole() -> None:
    with pytest.raises(EventTooLarge):
        SSEDecoder(max_event_bytes=50).feed(b"data: " + b"x" * 100)  # no newline yet
    decoder = SSEDecoder(max_event_bytes=50)
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            decoder.feed(b"data: 1234\n")  # one event, many lines
    many = SSEDecoder(max_event_bytes=50)
    for _ in range(100):
        assert many.feed(b"data: 1234\n\n") == [b"1234"]  # many small events are fine
