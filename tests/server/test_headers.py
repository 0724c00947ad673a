"""``werk.http.headers.header``: one request header from the ASGI scope."""

from __future__ import annotations

from starlette.requests import Request

from werk.http.headers import header


def _request(*pairs: tuple[bytes, bytes]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": list(pairs)})


def test_a_header_is_read_as_starlette_reads_it() -> None:
    request = _request(
        (b"host", b"127.0.0.1:8080"),
        (b"x-note", b"caf\xe9"),  # latin-1, as HTTP header bytes are decoded
        (b"x-twice", b"first"),
        (b"x-twice", b"second"),
    )
    for name in ("host", "x-note", "x-twice", "origin"):
        assert header(request, name.encode()) == request.headers.get(name)
    assert header(request, b"x-note") == "café"
    assert header(request, b"x-twice") == "first"  # the first of repeated headers


def test_an_absent_header_is_none_and_an_empty_one_is_empty() -> None:
    assert header(_request(), b"authorization") is None
    assert header(_request((b"authorization", b"")), b"authorization") == ""
