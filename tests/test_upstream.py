"""``werk.openai_upstream``: the one ``/v1`` relay to a backend's own server, against a scripted
loopback HTTP/1.1 server (a real TCP listener whose answers each test writes byte by byte; the
real backends are exercised in the plugins' tests: llama-server, vLLM, the oMLX stand-in)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest

import werk
from werk import LoopbackClient, UpstreamErrors, UpstreamSSE, openai_upstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Server:
    """Answers the n-th request with ``script[n]``; records bodies and connection numbers."""

    script: list[Answer]
    bodies: list[bytes] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    served_on: list[int] = field(default_factory=list)
    connections: int = 0
    eof: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.paths.append(head.split(b" ")[1].decode())
                self.bodies.append(await reader.readexactly(length))
                self.served_on.append(number)
                await self.script.pop(0)(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
        finally:
            writer.close()


def json_answer(status: int, payload: object) -> Answer:
    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = json.dumps(payload).encode()
        writer.write(
            b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(data), data)
        )
        await writer.drain()

    return run


def sse_answer(pieces: list[bytes], *, end: bool = True, hold: bool = False) -> Answer:
    """A chunked ``text/event-stream`` body of ``pieces`` (one chunk each); ``end`` writes the
    terminating chunk, else the connection is closed after the pieces (a cut stream).
    ``hold``: after the first piece, send nothing more until the client closes the connection
    (``Server.eof`` is set then)."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for index, piece in enumerate(pieces):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            if index == 0 and hold:
                await reader.read()  # returns at the client's EOF
                raise ConnectionResetError("the client closed the connection")
        if end:
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        else:
            writer.close()

    return run


async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Server, LoopbackClient]]:
    server = Server(script=[])
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = LoopbackClient("127.0.0.1", port, headers={"Authorization": "Bearer k"})
    try:
        yield server, client
    finally:
        await client.aclose()
        listener.close()


class Closes:
    """An ``on_close`` that counts its calls."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.mark.anyio
async def test_a_json_reply_is_returned_as_its_object(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [json_answer(200, {"model": "theirs", "choices": []})]
    closes = Closes()
    reply = await openai_upstream(
        client, "/v1/chat/completions", BODY, stream=False, what="X", on_close=closes
    )
    assert reply.body == {"model": "theirs", "choices": []}
    assert server.paths == ["/v1/chat/completions"] and json.loads(server.bodies[0]) == BODY
    assert closes.count == 1
    server.script = [json_answer(200, {"model": "theirs"})]
    renamed = await openai_upstream(
        client, "/v1/completions", b"{}", stream=False, what="X", model="ours"
    )
    assert renamed.body == {"model": "ours"} and server.bodies[1] == b"{}"  # bytes sent as given
    assert server.served_on == [1, 1]  # one pooled keep-alive connection


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error", "words", "reason"),
    [
        (400, werk.InvalidRequest, "X rejected the request: ", True),
        (404, werk.NotFound, "X does not know", False),
        (422, werk.InvalidRequest, "X rejected the request: ", True),
        (429, werk.ResourceExhausted, "X is at capacity", False),
        (501, werk.Unsupported, "X does not support", False),
        (503, werk.Unavailable, "X is not ready", False),
        (500, werk.BackendError, "X failed with HTTP 500", False),
    ],
)
async def test_error_statuses_become_werk_errors_with_a_validation_reason_only(
    upstream: tuple[Server, LoopbackClient],
    status: int,
    error: type[werk.WerkError],
    words: str,
    reason: bool,
) -> None:
    """A backend's reason for refusing a request (400/422) reaches the client; what it says
    about its own failures (5xx and the rest) does not."""
    server, client = upstream
    for stream in (False, True):
        detail = {"message": "'messages' is required", "param": "messages"}
        server.script = [json_answer(status, {"error": detail})]
        closes = Closes()
        with pytest.raises(error) as caught:
            await openai_upstream(
                client, "/v1/completions", BODY, stream=stream, what="X", on_close=closes
            )
        assert words in caught.value.message
        assert ("'messages' is required" in caught.value.message) is reason
        assert caught.value.param == ("messages" if reason else None)
        assert closes.count == 1


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("bad\x00value\nhere", "bad value here"),
        ("cannot open /home/me/.local/share/werk/models/x.gguf", "cannot open <path>"),
        ("key sk-0123456789abcdef0123456789abcdef0 refused", "key <redacted> refused"),
        ("y" * 2000, "y" * 499 + "…"),
    ],
)
def test_a_backend_reason_is_bounded_and_keeps_paths_and_keys_out(message: str, shown: str) -> None:
    from werk.upstream import backend_reason

    assert backend_reason({"message": message}) == shown


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens",
        "context length exceeded: 5000 > 4096",
    ],
)
def test_a_context_overflow_is_context_length_exceeded_with_its_numbers(message: str) -> None:
    from werk.upstream import map_upstream_status

    error = map_upstream_status(400, "vLLM", {"message": message})
    assert isinstance(error, werk.InvalidRequest)
    assert error.openai_code == "context_length_exceeded" and error.param == "messages"
    assert message in error.message


@pytest.mark.anyio
async def test_a_status_hook_is_asked_first_and_gets_the_error_object(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    seen: list[tuple[int, dict[str, object]]] = []

    def status(code: int, error: dict[str, object]) -> werk.WerkError | None:
        seen.append((code, error))
        return werk.InvalidRequest("too long for X") if error.get("type") == "ctx" else None

    hooks = UpstreamErrors(status=status)
    server.script = [json_answer(400, {"error": {"type": "ctx"}}), json_answer(400, {})]
    with pytest.raises(werk.InvalidRequest, match="too long for X"):
        await openai_upstream(client, "/v1/x", BODY, stream=False, what="X", errors=hooks)
    with pytest.raises(werk.InvalidRequest, match="X rejected"):  # the hook said nothing
        await openai_upstream(client, "/v1/x", BODY, stream=False, what="X", errors=hooks)
    assert seen == [(400, {"type": "ctx"}), (400, {})]


@pytest.mark.anyio
async def test_a_server_that_cannot_be_reached_is_unavailable() -> None:
    listener = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    client = LoopbackClient("127.0.0.1", port)
    closes = Closes()
    with pytest.raises(werk.Unavailable, match="X could not be reached") as caught:
        await openai_upstream(client, "/v1/x", BODY, stream=False, what="X", on_close=closes)
    assert caught.value.retryable and closes.count == 1
    seen: list[werk.LoopbackError] = []

    def transport(exc: werk.LoopbackError) -> werk.WerkError | None:
        seen.append(exc)
        return werk.Unavailable("X's process exited", retryable=True)

    with pytest.raises(werk.Unavailable, match="process exited"):
        await openai_upstream(
            client,
            "/v1/x",
            BODY,
            stream=False,
            what="X",
            errors=UpstreamErrors(transport=transport),
        )
    assert len(seen) == 1 and isinstance(seen[0], werk.NotSent)
    await client.aclose()


@pytest.mark.anyio
async def test_a_request_that_got_no_byte_is_sent_once_more_on_a_new_connection(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [json_answer(200, {"a": 1}), close_at_once, json_answer(200, {"a": 2})]
    await openai_upstream(client, "/v1/x", BODY, stream=False, what="X")  # pools connection 1
    closes = Closes()
    reply = await openai_upstream(client, "/v1/x", BODY, stream=False, what="X", on_close=closes)
    assert reply.body == {"a": 2} and closes.count == 1
    assert server.served_on == [1, 1, 2]  # the closed one, then a fresh connection
    server.script = [close_at_once, close_at_once, json_answer(200, {})]
    with pytest.raises(werk.Unavailable, match="could not be reached"):
        await openai_upstream(client, "/v1/x", BODY, stream=False, what="X")
    assert len(server.bodies) == 5  # one try and exactly one retry


@pytest.mark.anyio
async def test_a_stream_yields_data_payloads_split_anywhere_and_stops_at_done(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    wire = b'data: {"a":1}\n\n: ping\n\ndata: {"b"' + b":2}\r\n\r\nid: 3\ndata: [DONE]\n\n"
    for size in (1, 7, len(wire)):
        server.script = [sse_answer([wire[i : i + size] for i in range(0, len(wire), size)])]
        closes = Closes()
        reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X", on_close=closes)
        assert isinstance(reply.stream, UpstreamSSE)
        payloads = [payload async for payload in reply.stream]
        assert payloads == [b'{"a":1}', b'{"b":2}'] and closes.count == 1
        await reply.stream.aclose()
        assert closes.count == 1


@pytest.mark.anyio
async def test_a_finished_stream_returns_its_connection_to_the_pool(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    """``[DONE]`` ends the relay; the rest of the body is drained, so the next request (streamed
    or not) goes over the same connection: no connect per request."""
    server, client = upstream
    done = [b'data: {"a":1}\n\n', b"data: [DONE]\n\n"]
    server.script = [sse_answer(done), sse_answer(done), json_answer(200, {})]
    for _ in range(2):
        reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
        assert reply.stream is not None
        assert [p async for p in reply.stream] == [b'{"a":1}']
        await reply.stream.aclose()
    await openai_upstream(client, "/v1/x", BODY, stream=False, what="X")
    assert server.served_on == [1, 1, 1]


@pytest.mark.anyio
async def test_closing_a_stream_early_closes_the_upstream_connection(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [sse_answer([b'data: {"a":1}\n\n', b"data: [DONE]\n\n"], hold=True)]
    closes = Closes()
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X", on_close=closes)
    assert reply.stream is not None
    assert await reply.stream.__anext__() == b'{"a":1}'
    await reply.stream.aclose()  # what the host does when the client leaves
    assert closes.count == 1
    with anyio.fail_after(10):
        await server.eof.wait()  # the backend saw the connection close: it cancels
    assert client.idle_connections == 0


@pytest.mark.anyio
async def test_a_stream_never_iterated_is_closed_by_aclose(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [sse_answer([b'data: {"a":1}\n\n'], hold=True)]
    closes = Closes()
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X", on_close=closes)
    assert reply.stream is not None and closes.count == 0
    await reply.stream.aclose()
    await reply.stream.aclose()
    assert closes.count == 1
    with anyio.fail_after(10):
        await server.eof.wait()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("event", "error", "words"),
    [
        (
            b'data: {"error":{"message":"secret"}}\n\n',
            werk.BackendError,
            "X failed while streaming",
        ),
        (  # llama-server's shape: an error event whose data carries an HTTP code
            b'event: error\ndata: {"error":{"code":503,"message":"secret"}}\n\n',
            werk.Unavailable,
            "X is not ready",
        ),
        (  # a refusal (400) names its reason, as before the stream began
            b'event: error\ndata: {"code":400,"message":"bad stop"}\n\n',
            werk.InvalidRequest,
            "X rejected the request: bad stop",
        ),
    ],
)
async def test_an_error_event_mid_stream_is_a_werk_error_after_the_payloads_before_it(
    upstream: tuple[Server, LoopbackClient],
    event: bytes,
    error: type[werk.WerkError],
    words: str,
) -> None:
    server, client = upstream
    server.script = [sse_answer([b'data: {"a":1}\n\n' + event])]  # one chunk holds both
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert reply.stream is not None
    assert await reply.stream.__anext__() == b'{"a":1}'
    with pytest.raises(error, match=words) as caught:
        await reply.stream.__anext__()
    assert "secret" not in caught.value.message  # a failure's own words stay in the log
    await reply.stream.aclose()


@pytest.mark.anyio
async def test_a_stream_that_ends_without_done_is_a_backend_error(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    """The backend went away mid-reply (e.g. its engine died): the consumer must not mistake
    the truncated stream for a complete answer."""
    server, client = upstream
    server.script = [sse_answer([b'data: {"a":1}\n\n', b'data: {"b"'])]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert reply.stream is not None
    assert await reply.stream.__anext__() == b'{"a":1}'
    with pytest.raises(werk.BackendError, match="X ended its stream before finishing"):
        await reply.stream.__anext__()
    await reply.stream.aclose()


@pytest.mark.anyio
async def test_a_connection_lost_mid_stream_is_the_backends_failure(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [sse_answer([b'data: {"a":1}\n\n'], end=False)]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert reply.stream is not None
    assert await reply.stream.__anext__() == b'{"a":1}'
    with pytest.raises(werk.BackendError, match="X broke off its stream"):
        await reply.stream.__anext__()
    await reply.stream.aclose()


@pytest.mark.anyio
async def test_a_stream_that_stops_sending_is_a_timeout(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    client.read_timeout = 0.2
    server.script = [sse_answer([b'data: {"a":1}\n\n'], hold=True)]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert reply.stream is not None
    assert await reply.stream.__anext__() == b'{"a":1}'
    with pytest.raises(werk.WerkTimeout, match="X stopped sending its stream"):
        await reply.stream.__anext__()
    await reply.stream.aclose()


@pytest.mark.anyio
async def test_model_names_are_rewritten_and_everything_else_passes_byte_for_byte(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    untouched = b'{ "choices": [ {"delta": {"content": "a"}} ] }'  # odd spacing survives
    server.script = [
        sse_answer(
            [
                b'data: {"model": "theirs", "choices": []}\n\n',
                b"data: " + untouched + b"\n\ndata: not json\n\n",
                b"data: [DONE]\n\n",
            ]
        )
    ]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X", model="ours")
    assert reply.stream is not None
    payloads = [payload async for payload in reply.stream]
    assert payloads == [b'{"model":"ours","choices":[]}', untouched, b"not json"]


@pytest.mark.anyio
async def test_a_rewritten_stream_changes_json_chunks_and_closes_the_upstream(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [
        sse_answer(
            [b'data: {"model": "theirs", "choices": []}\n\n', b"data: [DONE]\n\n"], hold=True
        )
    ]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert reply.stream is not None
    stream = werk.RewrittenStream(reply.stream, werk.renamed("ours"))
    assert await stream.__anext__() == b'{"model":"ours","choices":[]}'
    await stream.aclose()
    with anyio.fail_after(10):
        await server.eof.wait()


@pytest.mark.anyio
async def test_a_reply_that_is_not_a_json_object_or_not_a_stream_is_refused(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    server.script = [json_answer(200, [1, 2]), json_answer(200, {})]
    with pytest.raises(werk.BackendError, match="not a JSON object"):
        await openai_upstream(client, "/v1/x", BODY, stream=False, what="X")
    closes = Closes()
    with pytest.raises(werk.BackendError, match="did not stream"):
        await openai_upstream(client, "/v1/x", BODY, stream=True, what="X", on_close=closes)
    assert closes.count == 1


def all_at_once(pieces: list[bytes]) -> Answer:
    """The head and every piece (one chunk each) in one write, then nothing more until the
    client closes the connection."""

    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
        )
        await writer.drain()
        await reader.read()

    return run


@pytest.mark.anyio
async def test_payloads_at_hand_are_taken_together_and_a_failure_after_them_still_raises(
    upstream: tuple[Server, LoopbackClient],
) -> None:
    server, client = upstream
    events = [b'data: {"model": "theirs", "n": %d}\n\n' % n for n in range(3)]
    server.script = [all_at_once([*events, b'data: {"error": {"message": "secret"}}\n\n'])]
    reply = await openai_upstream(client, "/v1/x", BODY, stream=True, what="X")
    assert isinstance(reply.stream, UpstreamSSE)
    stream = werk.RewrittenStream(reply.stream, werk.renamed("ours"))
    # one small write on loopback arrives in one read: the head and every event with it
    taken = [await stream.__anext__(), *stream.take_ready()]
    assert taken == [b'{"model":"ours","n":%d}' % n for n in range(3)]
    assert stream.take_ready() == []  # nothing at hand: the next one is awaited
    with pytest.raises(werk.BackendError, match="X failed while streaming"):
        await stream.__anext__()
    await stream.aclose()
