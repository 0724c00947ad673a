"""The ``werk`` member of ``/v1/chat/completions`` over real HTTP (testkv backend): a malformed
member fails closed before any backend work; ``persist: false`` relays as usual without it.
The persisted turns themselves run against llama.cpp in
``plugins/werk-llamacpp/tests/test_llamacpp_prefix_e2e.py``."""

from __future__ import annotations

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
