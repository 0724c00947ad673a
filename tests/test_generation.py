"""What a ``/v1`` chat or completion body may ask of a backend that generates text itself
(:func:`werk.generation_args`), and the OpenAI replies made from its generator's events
(:func:`werk.generation_reply`), whole and streamed, with vLLM's ``return_token_ids``."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from werk import InvalidRequest, OpenAICall, Unsupported, generation_args, generation_reply


def _args(route: str = "chat.completions", **body: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "m"}
    if route == "chat.completions":
        base["messages"] = [{"role": "user", "content": "hi"}]
    else:
        base["prompt"] = "once"
    return generation_args(OpenAICall(route=route, body=base | body), "demo")  # type: ignore[arg-type]


def test_defaults_follow_openai() -> None:
    chat = _args()
    assert chat == {"max_tokens": None, "stop": [], "messages": [{"role": "user", "content": "hi"}]}
    assert _args("completions") == {"max_tokens": 16, "stop": [], "prompt": "once"}


def test_what_a_body_asks_reaches_the_worker() -> None:
    args = _args(
        max_completion_tokens=5, max_tokens=9, temperature=0.5, top_p=0.9, seed=-1, stop="END",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": t} for t in "ab"]},
            {"role": "assistant", "content": None},
        ],
    )  # fmt: skip
    assert args["max_tokens"] == 5  # max_completion_tokens wins, as in OpenAI's API
    assert args["temperature"] == 0.5 and args["top_p"] == 0.9 and args["stop"] == ["END"]
    assert args["seed"] == 2**63 - 1
    assert [m["content"] for m in args["messages"]] == ["be brief", "ab", ""]
    # No-op values of fields this backend does not do are accepted.
    assert _args(tools=[], logprobs=False, response_format={"type": "text"}, n=1)["stop"] == []


@pytest.mark.parametrize(
    ("route", "body", "error", "text"),
    [
        ("chat.completions", {"tool_choice": "auto"}, Unsupported, "tool calling"),
        (
            "chat.completions",
            {"response_format": {"type": "json_object"}},
            Unsupported,
            "structured",
        ),
        ("chat.completions", {"presence_penalty": 0.5}, Unsupported, "penalties"),
        ("chat.completions", {"messages": [{"role": "tool", "content": "x"}]}, Unsupported, "tool"),
        ("chat.completions", {"messages": []}, InvalidRequest, "non-empty list"),
        (
            "chat.completions",
            {"messages": [{"role": "robot", "content": "x"}]},
            InvalidRequest,
            "role",
        ),
        ("chat.completions", {"max_tokens": 0}, InvalidRequest, "'max_tokens' must be a whole"),
        ("chat.completions", {"top_p": 0}, InvalidRequest, "greater than 0"),
        ("chat.completions", {"seed": 1.5}, InvalidRequest, "'seed'"),
        ("chat.completions", {"stop": 3}, InvalidRequest, "'stop'"),
        ("chat.completions", {"prompt": "x"}, InvalidRequest, "unknown field(s)"),
        ("completions", {"echo": True}, Unsupported, "'echo'"),
        ("completions", {"prompt": ["a", "b"]}, InvalidRequest, "one prompt per request"),
        ("completions", {"best_of": 3}, Unsupported, "one choice"),
    ],
)
def test_what_it_cannot_honour_is_refused_typed(
    route: str, body: dict[str, Any], error: type[Exception], text: str
) -> None:
    with pytest.raises(error) as raised:
        _args(route, **body)
    assert text in str(raised.value)


@given(st.dictionaries(st.text(min_size=1, max_size=12), st.none() | st.integers() | st.text()))
def test_any_body_is_answered_or_refused_typed(extra: dict[str, Any]) -> None:
    """Whatever fields a client adds, the check raises a Werk error or returns arguments."""
    try:
        args = _args(**extra)
    except (InvalidRequest, Unsupported):
        return
    assert set(args) <= {"max_tokens", "stop", "temperature", "top_p", "seed", "messages"}


class _Events:
    """A generation's events from a list, then its result; records whether it was left."""

    def __init__(self, events: list[dict[str, Any]], result: dict[str, Any]) -> None:
        self._events = events
        self._final = result
        self.result: dict[str, Any] | None = None
        self.left = False

    async def _iterate(self) -> AsyncIterator[dict[str, Any]]:
        for event in self._events:
            yield event
        self.result = self._final

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._iterate()


def _generation(events: _Events) -> contextlib.AbstractAsyncContextManager[_Events]:
    @contextlib.asynccontextmanager
    async def entered() -> AsyncIterator[_Events]:
        try:
            yield events
        finally:
            events.left = True

    return entered()


EVENTS = [{"text": "Hel", "ids": [5, 6]}, {"text": "lo", "ids": [7]}]
RESULT = {"finish_reason": "length", "usage": {"prompt_tokens": 4, "completion_tokens": 3}}


def _call(stream: bool, **body: Any) -> OpenAICall:
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return OpenAICall(route="chat.completions", body=base | body, stream=stream)


@pytest.mark.anyio
async def test_a_whole_reply_has_the_text_usage_and_asked_for_token_ids() -> None:
    events = _Events(EVENTS, RESULT | {"prompt_ids": [1, 2, 3, 4]})
    reply = await generation_reply(_call(False, return_token_ids=True), "m", _generation(events))
    assert events.left and reply.body is not None
    (choice,) = reply.body["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello"}
    assert choice["finish_reason"] == "length" and choice["token_ids"] == [5, 6, 7]
    assert reply.body["prompt_token_ids"] == [1, 2, 3, 4]
    assert reply.body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    plain = await generation_reply(_call(False), "m", _generation(_Events(EVENTS, RESULT)))
    assert plain.body is not None and "prompt_token_ids" not in plain.body
    assert "token_ids" not in plain.body["choices"][0]


@pytest.mark.anyio
async def test_a_stream_has_a_role_chunk_the_deltas_the_finish_and_the_usage() -> None:
    events = _Events(EVENTS, RESULT | {"prompt_ids": [1, 2, 3, 4]})
    call = _call(True, stream_options={"include_usage": True}, return_token_ids=True)
    reply = await generation_reply(call, "m", _generation(events))
    assert reply.stream is not None and not events.left  # the stream owns the generation
    chunks = [json.loads(payload) async for payload in reply.stream]
    assert events.left
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:3]] == ["Hel", "lo"]
    assert [c["choices"][0]["token_ids"] for c in chunks[1:3]] == [[5, 6], [7]]
    assert chunks[3]["choices"][0]["finish_reason"] == "length"
    assert chunks[3]["prompt_token_ids"] == [1, 2, 3, 4]
    assert chunks[4]["choices"] == [] and chunks[4]["usage"]["total_tokens"] == 7
    assert len({c["id"] for c in chunks}) == 1


@pytest.mark.anyio
async def test_a_stream_closed_early_leaves_the_generation() -> None:
    events = _Events(EVENTS * 10, RESULT)
    reply = await generation_reply(_call(True), "m", _generation(events))
    assert reply.stream is not None
    await anext(reply.stream)
    await reply.stream.aclose()  # type: ignore[attr-defined]
    assert events.left


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_a_refusal_is_an_invalid_request_before_any_reply(stream: bool) -> None:
    events = _Events([], {"refused": "the prompt has 3000 tokens; this model's context is 2048"})
    with pytest.raises(InvalidRequest, match="context is 2048"):
        await generation_reply(_call(stream), "m", _generation(events))
    assert events.left


RED_PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AA"
    "AAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def test_images_are_parts_in_order_only_where_the_backend_takes_them() -> None:
    content = [
        {"type": "text", "text": "What is "},
        {"type": "image_url", "image_url": {"url": RED_PNG}},
        {"type": "text", "text": "?"},
    ]
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    call = OpenAICall(route="chat.completions", body=body)
    (message,) = generation_args(call, "vlm", images=True)["messages"]
    assert message["content"] == [
        {"type": "text", "text": "What is "},
        {"type": "image", "url": RED_PNG},
        {"type": "text", "text": "?"},
    ]
    with pytest.raises(Unsupported, match="serves text"):
        generation_args(call, "text-only")


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("https://example.com/cat.png", "data:image/...;base64, URL"),
        ("data:text/plain;base64,aGk=", "data:image/...;base64, URL"),
        ("data:image/png;base64,###", "not valid base64"),
    ],
)
def test_an_image_that_is_not_an_inline_image_is_refused(url: str, text: str) -> None:
    part = {"type": "image_url", "image_url": {"url": url}}
    body = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    with pytest.raises(InvalidRequest, match=re.escape(text)):
        generation_args(OpenAICall(route="chat.completions", body=body), "vlm", images=True)


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_cached_tokens_a_generator_reports_reach_the_usage(stream: bool) -> None:
    result = {"finish_reason": "stop", "usage": {"prompt_tokens": 9, "completion_tokens": 3}}
    cached = result | {"usage": result["usage"] | {"cached_tokens": 6}}
    call = _call(stream, stream_options={"include_usage": True})
    reply = await generation_reply(call, "m", _generation(_Events(EVENTS, cached)))
    if stream:
        assert reply.stream is not None
        usage = [json.loads(p) async for p in reply.stream][-1]["usage"]
    else:
        assert reply.body is not None
        usage = reply.body["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 6}
    plain = await generation_reply(_call(False), "m", _generation(_Events(EVENTS, result)))
    assert plain.body is not None and "prompt_tokens_details" not in plain.body["usage"]
