"""The official ``openai`` package talks to ``werk serve``'s ``/v1`` unchanged.

Only ``base_url`` and ``api_key`` are set (plus ``max_retries=0`` so a failure shows at once).
The testkv decoder is deterministic and shared by ``/v1`` and ``/werk/v1``, so the SDK's answers
are checked against a Werk prefill + decode of the same text, and streaming against
non-streaming.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
from _server import WerkServer

KEY = "openai-sdk-key-31415926"
SECRET = "/testkv/secret/internal-failure-detail"
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "name three colours"},
]


@pytest.fixture(scope="module")
def server(spawn_server: Callable[..., WerkServer]) -> WerkServer:
    return spawn_server(keys=[KEY])


@pytest.fixture(scope="module")
def sdk(server: WerkServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=30)
    with client:
        yield client


def werk_answer(server: WerkServer, body: dict[str, object], max_tokens: int = 64) -> str:
    """The same text through ``/werk/v1`` prefill + decode."""
    with server.client(KEY) as http:
        made = http.post(
            "/werk/v1/prefill", json={"model": "kv", "allow_experimental": True, **body}
        )
        assert made.status_code == 200, made.text
        token = made.json()["handoff"]["token"]
        decoded = http.post("/werk/v1/decode", json={"handoff": token, "max_tokens": max_tokens})
        assert decoded.status_code == 200, decoded.text
        text: str = decoded.json()["text"]
        return text


def test_models_list(sdk: openai.OpenAI) -> None:
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["kv"]
    assert models.data[0].owned_by == "testkv"


def test_chat_completion_non_streaming(sdk: openai.OpenAI, server: WerkServer) -> None:
    reply = sdk.chat.completions.create(model="kv", messages=MESSAGES)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.model == "kv" and reply.usage is not None
    assert reply.usage.completion_tokens >= 1
    assert reply.system_fingerprint is not None and reply.system_fingerprint.startswith("g_")
    messages = [{"role": m["role"], "content": m["content"]} for m in MESSAGES]
    assert choice.message.content == werk_answer(server, {"messages": messages})


def test_chat_completion_streaming(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(model="kv", messages=MESSAGES)
    deltas: list[str] = []
    finish: list[str] = []
    with sdk.chat.completions.create(model="kv", messages=MESSAGES, stream=True) as stream:
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            for choice in chunk.choices:
                if choice.delta.content:
                    deltas.append(choice.delta.content)
                if choice.finish_reason:
                    finish.append(choice.finish_reason)
    assert len(deltas) >= 2  # relayed word by word, not as one body
    assert "".join(deltas) == whole.choices[0].message.content
    assert finish == [whole.choices[0].finish_reason]


def test_stream_with_usage(sdk: openai.OpenAI) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model="kv", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens >= 1


def test_text_completion(sdk: openai.OpenAI, server: WerkServer) -> None:
    reply = sdk.completions.create(model="kv", prompt="once upon a time", max_tokens=5)
    assert reply.object == "text_completion"
    text = reply.choices[0].text
    assert text and text == werk_answer(server, {"prompt": "once upon a time"}, max_tokens=5)
    streamed = sdk.completions.create(
        model="kv", prompt="once upon a time", max_tokens=5, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == text


def test_unknown_model_is_not_found_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert caught.value.status_code == 404
    assert caught.value.code == "not_found"
    assert caught.value.response.headers["x-werk-request-id"].startswith("req_")


def test_wrong_key_is_authentication_error(server: WerkServer) -> None:
    with openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key=KEY + "-wrong", max_retries=0
    ) as wrong:
        with pytest.raises(openai.AuthenticationError) as caught:
            wrong.models.list()
        assert caught.value.code == "unauthenticated"
        with pytest.raises(openai.AuthenticationError):
            wrong.chat.completions.create(model="kv", messages=MESSAGES)


def test_malformed_request_is_bad_request_error(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.chat.completions.create(model="kv", messages=MESSAGES, n=2)
    assert caught.value.code == "invalid_request"
    with pytest.raises(openai.BadRequestError):
        sdk.completions.create(model="kv", prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(model="kv", messages=[])


def test_backend_failure_is_an_api_error(sdk: openai.OpenAI) -> None:
    failing: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "please <<fail-decode>>"}
    ]
    with pytest.raises(openai.InternalServerError) as caught:
        sdk.chat.completions.create(model="kv", messages=failing)
    assert caught.value.status_code == 502 and caught.value.code == "backend_error"
    assert SECRET not in str(caught.value.body)


def test_mid_stream_failure_is_an_error_event_not_a_hang(sdk: openai.OpenAI) -> None:
    failing: list[openai.types.chat.ChatCompletionMessageParam] = [
        {"role": "user", "content": "stream then <<fail-decode>>"}
    ]
    received = []
    stream = sdk.chat.completions.create(model="kv", messages=failing, stream=True)
    with pytest.raises(openai.APIError) as caught:
        for chunk in stream:
            received.append(chunk)
    stream.close()
    assert len(received) == 1 and received[0].choices[0].delta.role == "assistant"
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "backend_error", body
    assert SECRET not in str(body)


def test_raw_v1_errors_use_the_openai_shape(server: WerkServer) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        response = http.get("/v1/models")
    assert response.status_code == 401
    body = response.json()
    assert body == {
        "error": {
            "message": "missing or invalid API key",
            "type": "authentication_error",
            "code": "unauthenticated",
            "param": None,
            "request_id": response.headers["x-werk-request-id"],
        }
    }
