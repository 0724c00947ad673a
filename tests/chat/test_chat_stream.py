"""Reading replies: the bounded SSE reader and the chunk accumulator."""

from __future__ import annotations

import json

import pytest

from werk.chat.sse import sse_data
from werk.chat.stream import ReplyAccumulator, cached_tokens
from werk.protocol import BackendError, NotFound, PayloadTooLarge


def test_sse_events_split_anywhere() -> None:
    raw = (
        b': comment\r\ndata: {"a":1}\r\n\r\nevent: x\ndata: line1\ndata:line2\nid: 7\n\n'
        b"data: [DONE]\n\ndata: partial-without-end"
    )
    expected = [b'{"a":1}', b"line1\nline2", b"[DONE]"]
    for size in (1, 2, 5, len(raw)):
        chunks = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert list(sse_data(chunks)) == expected


def test_sse_bounds() -> None:
    with pytest.raises(PayloadTooLarge):
        list(sse_data([b"data: " + b"x" * 100], max_event_bytes=50))  # no newline yet
    with pytest.raises(PayloadTooLarge):
        list(sse_data([b"data: 1234\n"] * 20, max_event_bytes=50))  # one event, many lines
    with pytest.raises(PayloadTooLarge):
        list(sse_data([b"data: 1\n\n"] * 100, max_total_bytes=500))


def chunk(content: str | None = None, finish: str | None = None, **extra: object) -> dict:
    delta = {} if content is None else {"content": content}
    return {
        "id": "c1",
        "created": 5,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def test_accumulator_builds_the_response() -> None:
    acc = ReplyAccumulator("m")
    pieces = [acc.feed(c) for c in (chunk(""), chunk("Hel"), chunk("lo"), chunk(None, "stop"))]
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    acc.feed({"choices": [], "usage": usage, "system_fingerprint": "g_1"})
    assert pieces == ["", "Hel", "lo", ""]
    response = acc.response()
    assert response["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["id"] == "c1" and response["system_fingerprint"] == "g_1"
    assert cached_tokens(acc.usage) == 2 and cached_tokens(None) is None
    whole = ReplyAccumulator("m")
    whole.feed({"choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "length"}]})
    assert (whole.text, whole.finish_reason) == ("Hi", "length")


@pytest.mark.parametrize(
    "bad",
    [
        [],
        {"choices": "x"},
        {"choices": [1]},
        {"choices": [{"delta": []}]},
        {"choices": [{"delta": {"content": 3}}]},
    ],
)
def test_malformed_chunks_are_refused(bad: object) -> None:
    with pytest.raises(BackendError):
        ReplyAccumulator("m").feed(bad)


def test_error_chunks_become_typed_errors() -> None:
    body = json.loads('{"error": {"message": "no such model", "code": "not_found"}}')
    with pytest.raises(NotFound, match="no such model"):
        ReplyAccumulator("m").feed(body)
    with pytest.raises(BackendError):
        ReplyAccumulator("m").feed({"error": {"message": "x", "code": "made-up"}})


def test_reply_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    import werk.chat.stream as stream

    monkeypatch.setattr(stream, "MAX_REPLY_CHARS", 10)
    acc = ReplyAccumulator("m")
    acc.feed(chunk("x" * 10))
    with pytest.raises(PayloadTooLarge):
        acc.feed(chunk("y"))
