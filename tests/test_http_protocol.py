"""``werk.http.server.HeaderDeadlineProtocol`` driven directly: fed bytes the way asyncio feeds
it, writing to a recording transport, with a deadline short enough to watch. The end-to-end
tests (``tests/server/test_hardening*.py``) cover the same protocol through a real server;
these pin which deadline runs when."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from werk.http.server import HeaderDeadlineProtocol

pytestmark = pytest.mark.anyio


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.writes: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.written += bytes(data)
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(name, default)


def _protocol(app: Any, header_timeout: float) -> tuple[HeaderDeadlineProtocol, Transport]:
    config = uvicorn.Config(app, lifespan="off", log_level="critical")
    config.load()
    cls = type("P", (HeaderDeadlineProtocol,), {"header_timeout": header_timeout})
    protocol = cls(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def _slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await asyncio.sleep(0.5)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


REQUEST = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"


async def test_a_whole_head_costs_no_timer_and_a_split_one_runs_from_its_first_byte() -> None:
    protocol, transport = _protocol(_slow_app, header_timeout=0.2)
    protocol.data_received(REQUEST)  # the connection's own timer ends with the first head
    assert protocol._header_timer is None
    await asyncio.sleep(0.6)
    assert transport.written.endswith(b"ok") and not transport.closed
    protocol.data_received(b"GET / HT")  # the next head, in pieces
    assert protocol._header_timer is not None
    await asyncio.sleep(0.1)
    protocol.data_received(b"TP/1.1\r\nHo")  # a later piece does not move the deadline
    await asyncio.sleep(0.15)
    assert transport.closed


async def test_garbage_behind_a_slow_request_waits_for_its_answer_not_the_deadline() -> None:
    """The parser begins a message at the garbage's first byte and then refuses it; the 400
    waits for the request before it (0.5 s), and no header deadline (0.2 s) cuts that short."""
    protocol, transport = _protocol(_slow_app, header_timeout=0.2)
    protocol.data_received(REQUEST + b"XYZ / HTTP/1.1\r\n")
    assert not transport.reading
    await asyncio.sleep(0.35)
    assert not transport.closed and transport.written == b""
    await asyncio.sleep(0.4)
    assert transport.closed
    first, _, rest = transport.written.partition(b"ok")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert rest.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b'"code":"invalid_request"' in rest


async def _plain_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


async def _stream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await asyncio.sleep(0.3)  # a backend still thinking about its first event
    await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def test_a_plain_reply_goes_out_in_one_write() -> None:
    protocol, transport = _protocol(_plain_app, header_timeout=5)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.05)
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\n\r\nok")


async def test_a_stream_head_is_not_held_until_its_first_event() -> None:
    protocol, transport = _protocol(_stream_app, header_timeout=5)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.1)
    assert len(transport.writes) == 1  # the head alone, at the end of the pass that sent it
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"transfer-encoding: chunked\r\n\r\n")
    await asyncio.sleep(0.4)
    assert transport.written.endswith(b"data: 1\n\n\r\n0\r\n\r\n")


async def test_continue_is_sent_before_the_body_is_read() -> None:
    async def echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        await _plain_app(scope, receive, send) if body == b"ok" else None

    protocol, transport = _protocol(echo, header_timeout=5)
    protocol.data_received(
        b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    await asyncio.sleep(0.05)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]  # not held back
    protocol.data_received(b"ok")
    await asyncio.sleep(0.05)
    assert transport.written.endswith(b"\r\n\r\nok")


async def test_a_head_held_when_the_connection_closes_is_written_first() -> None:
    async def head_then_failure(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the app failed after its head")  # uvicorn closes the connection

    protocol, transport = _protocol(head_then_failure, header_timeout=5)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.05)
    assert transport.closed
    assert transport.writes == [transport.written]
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
