"""``werk.LoopbackClient`` against a real scripted HTTP/1.1 server on loopback.

Every framing (``Content-Length``, chunked with extensions and trailers, close-delimited), the
pool's reuse rules, and each failure class (what is safe to retry and what is not) are exercised
over real sockets; a hypothesis test cuts chunked bodies into arbitrary chunks and TCP writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from werk import (
    BrokenResponse,
    LoopbackClient,
    LoopbackTimeout,
    NotSent,
    ResponseTooLarge,
)

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[None]]


@dataclass
class Server:
    """Answers each request with the next scripted answer; records heads and connections."""

    script: list[Answer] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.heads.append(head)
                self.bodies.append(body)
                await self.script.pop(0)(reader, writer, body)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # a scripted connection ends quietly, even when the loop tears it down
        finally:
            writer.close()


def raw(*pieces: bytes, close: bool = False, pause: float = 0.0) -> Answer:
    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            if pause:
                await asyncio.sleep(pause)
        if close:
            writer.close()

    return run


def ok(body: bytes, *headers: str) -> Answer:
    extra = "".join(f"{h}\r\n" for h in headers)
    return raw(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    listener = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = listener.sockets[0].getsockname()[1]
    yield state
    listener.close()


def client_for(server: Server, **kwargs: float) -> LoopbackClient:
    return LoopbackClient("127.0.0.1", server.port, headers={"Authorization": "Bearer k"}, **kwargs)


async def fetch(client: LoopbackClient, body: bytes = b"{}", **kwargs: bool) -> bytes:
    response = await client.request("POST", "/v1/x", body=body, **kwargs)
    async with response:
        assert response.status == 200
        return await response.read(1 << 20)


@pytest.mark.anyio
async def test_content_length_responses_reuse_one_connection(server: Server) -> None:
    server.script = [ok(b"one"), ok(b"two"), ok(b"three")]
    client = client_for(server)
    assert [await fetch(client, b'{"n": %d}' % i) for i in range(3)] == [b"one", b"two", b"three"]
    assert server.connections == 1 and client.idle_connections == 1
    head = server.heads[0].decode()
    assert head.startswith("POST /v1/x HTTP/1.1\r\n")
    assert "Authorization: Bearer k\r\n" in head and "Accept-Encoding: identity\r\n" in head
    assert f"Host: 127.0.0.1:{server.port}\r\n" in head and "Content-Length: 8\r\n" in head
    assert server.bodies == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    await client.aclose()
    with pytest.raises(NotSent, match="closed"):
        await client.request("GET", "/")


@pytest.mark.anyio
async def test_chunked_body_with_extensions_and_trailers(server: Server) -> None:
    server.script = [
        raw(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n"
            b"\r\n5;name=value\r\nhello\r\n",
            b"6\r\n world\r\n0\r\nX-Trailer: yes\r\n\r\n",
            pause=0.01,
        ),
        ok(b"next"),
    ]
    client = client_for(server)
    response = await client.request("GET", "/stream")
    assert response.content_type == "text/event-stream"
    parts = [part async for part in response]
    assert b"".join(parts) == b"hello world" and len(parts) >= 2  # bytes as they arrived
    await response.aclose()
    assert await fetch(client) == b"next"
    assert server.connections == 1  # a fully read chunked body returns its connection


@pytest.mark.anyio
async def test_whole_chunks_received_together_come_as_one_part(server: Server) -> None:
    """Chunks already received are handed over joined (the relay writes them at once); a
    chunk still arriving is handed over in pieces as before, and nothing waits for more."""
    gate = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n5\r\nfo"
        )
        await writer.drain()
        await gate.wait()
        writer.write(b"ur!\r\n1\r\n5\r\n0\r\n\r\n")
        await writer.drain()

    server.script = [answer, ok(b"next")]
    client = client_for(server)
    response = await client.request("GET", "/stream")
    parts = aiter(response)
    # one small write on loopback arrives in one read, together with the head
    assert await parts.__anext__() == b"onetwothree"
    assert await parts.__anext__() == b"fo"  # the part of a chunk at hand, without waiting
    gate.set()
    assert b"".join([part async for part in parts]) == b"ur!5"
    await response.aclose()
    assert await fetch(client) == b"next" and server.connections == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "answer",
    [
        raw(b"HTTP/1.1 200 OK\r\n\r\nuntil the end", close=True),  # close-delimited
        ok(b"bye", "Connection: close"),
        raw(b"HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nold"),  # 1.0 without keep-alive
    ],
)
async def test_connections_that_must_not_be_reused_are_closed(
    server: Server, answer: Answer
) -> None:
    server.script = [answer, ok(b"again")]
    client = client_for(server)
    assert await fetch(client)
    assert client.idle_connections == 0
    assert await fetch(client) == b"again"
    assert server.connections == 2


@pytest.mark.anyio
async def test_no_response_byte_is_not_sent_and_a_fresh_retry_works(server: Server) -> None:
    server.script = [raw(close=True), ok(b"retried")]
    client = client_for(server)
    with pytest.raises(NotSent, match="before any response byte"):
        await fetch(client)
    assert await fetch(client, fresh=True) == b"retried"
    assert client.idle_connections == 1  # the fresh connection, read to its end, is pooled
    assert server.connections == 2


@pytest.mark.anyio
async def test_a_refused_connection_is_not_sent() -> None:
    with socket_port() as port:
        client = LoopbackClient("127.0.0.1", port)
        with pytest.raises(NotSent, match="could not connect"):
            await client.request("GET", "/")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (raw(b"HTTP/1.1 2", close=True), "inside the response head"),
        (raw(b"HTTP/1.1 100 Continue\r\n\r\n", close=True), "inside the response head"),
        (raw(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", close=True), "body's end"),
        (raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), "chunk size"),
        (raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab", close=True), "chunk"),
        (raw(b"SPDY/3 200 OK\r\n\r\n"), "status line"),
        (raw(b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"), "header line"),
        (raw(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"), "Content-Length"),
    ],
)
async def test_failures_after_the_first_byte_are_broken_responses(
    server: Server, answer: Answer, message: str
) -> None:
    server.script = [answer]
    client = client_for(server)
    with pytest.raises(BrokenResponse, match=message):
        await fetch(client)
    assert client.idle_connections == 0


@pytest.mark.anyio
async def test_interim_responses_are_skipped_and_bodyless_statuses_have_no_body(
    server: Server,
) -> None:
    server.script = [
        raw(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"),
        raw(b"HTTP/1.1 204 No Content\r\n\r\n"),
        ok(b"after"),
    ]
    client = client_for(server)
    assert await fetch(client) == b"ok"
    response = await client.request("DELETE", "/thing")
    assert response.status == 204 and await response.read(10) == b""
    await response.aclose()
    assert await fetch(client) == b"after" and server.connections == 1


@pytest.mark.anyio
async def test_read_limit_and_timeouts(server: Server) -> None:
    server.script = [ok(b"x" * 100), raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab")]
    client = client_for(server, read_timeout=0.3)
    response = await client.request("GET", "/big")
    with pytest.raises(ResponseTooLarge):
        await response.read(99)
    await response.aclose()
    assert client.idle_connections == 0  # an unread rest closes the connection
    response = await client.request("GET", "/slow")
    with pytest.raises(LoopbackTimeout):
        await response.read(10)
    await response.aclose()


@pytest.mark.anyio
async def test_an_abandoned_stream_closes_its_connection(server: Server) -> None:
    seen_eof = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await reader.read()  # returns at the client's EOF: the generation would be cancelled
        seen_eof.set()

    server.script = [endless]
    client = client_for(server)
    response = await client.request("GET", "/stream")
    async for part in response:
        assert part == b"abc"
        break
    await response.aclose()
    await asyncio.wait_for(seen_eof.wait(), 5)
    assert client.idle_connections == 0


@pytest.mark.anyio
async def test_a_pooled_connection_the_server_closed_is_not_used(server: Server) -> None:
    async def answer_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.close()  # after the response, like an idle keep-alive timeout

    server.script = [answer_then_close, ok(b"b")]
    client = client_for(server)
    assert await fetch(client) == b"a" and client.idle_connections == 1
    await asyncio.sleep(0.2)
    assert await fetch(client) == b"b"  # no NotSent: the dead idle connection was skipped
    assert server.connections == 2


@pytest.mark.anyio
async def test_a_spare_connection_spares_the_next_request_a_connect(server: Server) -> None:
    """Like llama-server after a streamed response, this server closes every connection after
    its response: with ``spare=1`` the next request goes out on a connection made before it was
    asked for (so it waits for no connect), and the spare is replaced after each use."""
    accepted: list[float] = []
    handle = server.handle

    async def counting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(asyncio.get_running_loop().time())
        await handle(reader, writer)

    server.handle = counting  # type: ignore[method-assign]
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    answer = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", close=True)
    server.script = [answer, answer, answer]
    client = client_for(server, spare=1)
    try:
        assert await fetch(client) == b"x"
        await asyncio.sleep(0.1)
        assert len(accepted) == 2  # the request's connection and the spare
        asked = asyncio.get_running_loop().time()
        assert await fetch(client) == b"x"
        assert server.connections >= 2 and accepted[1] < asked  # made before it was asked for
        await asyncio.sleep(0.1)
        assert len(accepted) == 3 and client.idle_connections >= 1  # replaced after its use
        assert await fetch(client) == b"x"
        assert len(server.bodies) == 3
    finally:
        await client.aclose()
        listener.close()
    assert client.idle_connections == 0


@pytest.mark.anyio
async def test_without_a_spare_each_request_after_a_close_connects_itself(server: Server) -> None:
    answer = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", close=True)
    server.script = [answer, answer]
    client = client_for(server)
    assert await fetch(client) == b"x"
    await asyncio.sleep(0.1)
    assert server.connections == 1
    assert await fetch(client) == b"x"
    assert server.connections == 2
    await client.aclose()


@pytest.mark.anyio
async def test_aclose_leaves_no_spare_behind() -> None:
    """``aclose`` right after a request cancels the spare's connect or closes the spare: every
    connection the server accepted (the request's and the spare's) ends from the client's side,
    and the client refuses new requests."""
    accepted = 0
    ended: list[bool] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        try:
            if await reader.readuntil(b"\r\n\r\n"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx")
                await writer.drain()
            ended.append(await reader.read() == b"")  # the client closed its end
        except (asyncio.IncompleteReadError, ConnectionError):
            ended.append(True)  # the spare, closed (or reset) without a request
        finally:
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = LoopbackClient("127.0.0.1", port, spare=1)
    try:
        async with await client.request("GET", "/") as response:
            assert await response.read(10) == b"x"
        await asyncio.sleep(0.05)  # let the spare connect: aclose must close it
        await client.aclose()
        for _ in range(100):
            if len(ended) == accepted:
                break
            await asyncio.sleep(0.01)
        assert accepted == 2 and ended == [True, True]
        assert client.idle_connections == 0
        with pytest.raises(NotSent, match="closed"):
            await client.request("GET", "/")
    finally:
        listener.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=8),
    writes=st.integers(min_value=1, max_value=64),
)
def test_chunked_bodies_survive_any_chunking_and_segmentation(
    body: bytes, cuts: list[int], writes: int
) -> None:
    chunks, rest = [], body
    for cut in cuts * (len(body) // max(sum(cuts), 1) + 1):
        if not rest:
            break
        chunks.append(rest[:cut])
        rest = rest[cut:]
    if rest:
        chunks.append(rest)
    framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed
    step = max(1, len(wire) // writes)
    pieces = [wire[i : i + step] for i in range(0, len(wire), step)]

    async def scenario() -> None:
        state = Server(script=[raw(*pieces), ok(b"next")])
        listener = await asyncio.start_server(state.handle, "127.0.0.1", 0)
        state.port = listener.sockets[0].getsockname()[1]
        try:
            client = client_for(state)
            assert await fetch(client) == body
            assert await fetch(client) == b"next" and state.connections == 1
            await client.aclose()
        finally:
            listener.close()

    asyncio.run(scenario())


class socket_port:
    """A port nothing listens on (bound, never listening, released at exit)."""

    def __enter__(self) -> int:
        import socket

        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
