"""The ``werk`` member of ``/v1/chat/completions`` over real HTTP (testkv backend): a malformed
member fails closed before any backend work; ``persist: false`` relays as usual without it.
The persisted turns themselves run against llama.cpp in
``plugins/werk-llamacpp/tests/test_llamacpp_prefix_e2e.py``."""

from __future__ import annotations

import json
from typing import Any

import httpx
from _server import WerkServer

MESSAGES = [{"role": "user", "content": "hello"}]


def test_a_malformed_werk_member_is_refused(local_server: WerkServer) -> None:
    with local_server.client() as http:
        for werk in ({"persist": True, "bogus": 1}, {"persist": "yes"}, ["persist"]):
            answer = http.post(
                "/v1/chat/completions", json={"model": "kv", "messages": MESSAGES, "werk": werk}
            )
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["param"] == "werk"
        persisted = http.post(
            "/v1/chat/completions",
            json={
                "model": "kv",
                "messages": [{"role": "user", "content": ["x"]}],
                "werk": {"persist": True},
            },
        )
        assert persisted.status_code == 400 and persisted.json()["error"]["param"] == "messages"
        plain = http.post(
            "/v1/chat/completions",
            json={"model": "kv", "messages": MESSAGES, "werk": {"persist": False}},
        )
        assert plain.status_code == 200, plain.text
        assert "werk" not in plain.json()


def _events(answer: httpx.Response) -> list[Any]:
    data = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data
    return [json.loads(d) for d in data[:-1]]


def test_a_streamed_persisted_turn_sends_the_reply_then_the_kept_state(
    local_server: WerkServer,
) -> None:
    """testkv does not stream its decode: the reply comes as one piece, the same text as the
    unstreamed turn; the last chunk has the finish reason, usage and the ``werk`` member. (The
    OpenAI SDK's ``stream_options`` and ``n: 1`` are accepted.)"""
    werk = {"persist": True, "allow_experimental": True}
    body = {"model": "kv", "messages": MESSAGES, "max_tokens": 6, "werk": werk}
    with local_server.client() as http:
        whole = http.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        streamed = http.post(
            "/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}, "n": 1},
        )
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["content-type"].startswith("text/event-stream")
    chunks = _events(streamed)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole.json()["choices"][0]["message"]["content"]
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == whole.json()["choices"][0]["finish_reason"]
    assert last["werk"]["state_id"] and last["usage"]["completion_tokens"] > 0


def test_a_streamed_persisted_turn_that_fails_before_its_reply_is_an_error_status(
    local_server: WerkServer,
) -> None:
    body = {"model": "nope", "messages": MESSAGES, "stream": True, "werk": {"persist": True}}
    with local_server.client() as http:
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["param"] == "model"
