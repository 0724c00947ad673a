"""The access log of ``werk serve``: one line per request at the default level, none with
``--quiet``; never a body, header or key; concurrent requests each get their own line."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

from _server import SpawnServer, WerkServer

KEY = "key-access-log-0123456789"
SECRET_PROMPT = "the-secret-prompt-text"
LINE = re.compile(
    r"^werk: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (?P<status>\d{3}) (?P<method>[A-Z]+) (?P<path>\S+) "
    r"model=(?P<model>\S+) (?P<ms>\d+\.\d)ms (?P<client>\S+) (?P<id>req_[0-9a-f]{24})$"
)


def _access_lines(server: WerkServer) -> list[re.Match[str]]:
    return [m for m in map(LINE.match, server.log().splitlines()) if m]


def _chat(model: str, stream: bool = False) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": SECRET_PROMPT}],
        "max_tokens": 3,
        "stream": stream,
    }


def test_every_request_gets_one_line_with_model_status_and_request_id(
    spawn_server: SpawnServer,
) -> None:
    server = spawn_server(keys=[KEY])
    before = len(_access_lines(server))
    with server.client(KEY) as http:
        ok = http.post("/v1/chat/completions", json=_chat("kv"))
        streamed = http.post("/v1/chat/completions", json=_chat("kv", stream=True))
        missing = http.post("/v1/chat/completions", json=_chat("no-such-model"))
        listed = http.get("/werk/v1/states", params={"limit": 5})
    with server.client() as anonymous:
        unauthenticated = anonymous.get("/v1/models")
    assert [ok.status_code, streamed.status_code, missing.status_code] == [200, 200, 404]
    replies = (ok, streamed, missing, listed, unauthenticated)
    wanted = {reply.headers["x-werk-request-id"] for reply in replies}
    deadline = time.monotonic() + 10  # a line is written once its exchange has ended, which
    while True:  # for a stream can be just after the client read its last byte
        by_id = {m["id"]: m for m in _access_lines(server)[before:]}
        if wanted <= set(by_id) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for reply, status, method, path, model in (
        (ok, "200", "POST", "/v1/chat/completions", "kv"),
        (streamed, "200", "POST", "/v1/chat/completions", "kv"),
        (missing, "404", "POST", "/v1/chat/completions", "no-such-model"),
        (listed, "200", "GET", "/werk/v1/states", "-"),
        (unauthenticated, "401", "GET", "/v1/models", "-"),
    ):
        line = by_id[reply.headers["x-werk-request-id"]]
        assert (line["status"], line["method"], line["path"], line["model"]) == (
            status,
            method,
            path,
            model,
        )
        assert line["client"] == "127.0.0.1"
    text = server.log()
    assert KEY not in text and SECRET_PROMPT not in text and "limit=5" not in text


def test_concurrent_requests_each_get_their_line(spawn_server: SpawnServer) -> None:
    server = spawn_server()
    before = len(_access_lines(server))

    def one(_: int) -> str:
        with server.client() as http:
            reply = http.post("/v1/chat/completions", json=_chat("kv"))
            assert reply.status_code == 200
            return str(reply.headers["x-werk-request-id"])

    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(one, range(24)))
    chats = [m for m in _access_lines(server)[before:] if m["path"] == "/v1/chat/completions"]
    logged = {m["id"] for m in chats}
    assert ids <= logged and len(ids) == 24


def test_quiet_logs_no_request(spawn_server: SpawnServer) -> None:
    server = spawn_server(args=["--quiet"])
    with server.client() as http:
        assert http.post("/v1/chat/completions", json=_chat("kv")).status_code == 200
        assert http.get("/v1/models").status_code == 200
    assert _access_lines(server) == []
    assert "werk: serving on" in server.log()  # the start-up lines are not the access log
