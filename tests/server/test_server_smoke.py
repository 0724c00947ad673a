"""A first end-to-end check: a real werk serve with the testkv backend answers."""

from __future__ import annotations

from _server import WerkServer


def test_prefill_then_decode_over_http(local_server: WerkServer) -> None:
    with local_server.client() as http:
        info = http.get("/werk/v1/info")
        assert info.status_code == 200
        assert info.headers["x-werk-request-id"].startswith("req_")
        assert info.json()["server"]["auth"] == "unauthenticated_local"
        prefill = http.post(
            "/werk/v1/prefill",
            json={"model": "kv", "prompt": "hello world", "allow_experimental": True},
        )
        assert prefill.status_code == 200, prefill.text
        token = prefill.json()["handoff"]["token"]
        decode = http.post("/werk/v1/decode", json={"handoff": token, "max_tokens": 8})
        assert decode.status_code == 200, decode.text
        assert decode.json()["text"]
        again = http.post("/werk/v1/decode", json={"handoff": token})
        assert again.status_code == 410
        assert again.json()["error"]["code"] == "invalid_handoff"
