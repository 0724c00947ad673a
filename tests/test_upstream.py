"""``werk.openai_upstream``: relaying ``/v1`` to a backend's own server, against scripted
upstream answers (httpx's ``MockTransport``; the real thing is exercised with vLLM in
``plugins/werk-vllm/tests/test_vllm_serve.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

import werk
from werk import UpstreamSSE, openai_upstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Tracked(httpx.AsyncByteStream):
    """A response body that records whether it was closed."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="http://upstream", transport=httpx.MockTransport(handler))


@pytest.mark.anyio
async def test_a_json_reply_is_returned_as_its_object() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"choices": [{"finish_reason": "stop"}]})

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/chat/completions", BODY, stream=False, what="X")
    assert reply.body == {"choices": [{"finish_reason": "stop"}]}
    assert seen[0].url.path == "/v1/chat/completions"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error", "words"),
    [
        (400, werk.InvalidRequest, "X rejected the request as invalid"),
        (404, werk.NotFound, "X does not know"),
        (429, werk.ResourceExhausted, "X is at capacity"),
        (503, werk.Unavailable, "X is not ready"),
        (500, werk.BackendError, "X failed with HTTP 500"),
    ],
)
async def test_error_statuses_become_werk_errors_without_the_backends_text(
    status: int, error: type[werk.WerkError], words: str
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": "secret backend detail"}})

    async with client(answer) as http:
        with pytest.raises(error) as caught:
            await openai_upstream(http, "/v1/completions", BODY, stream=False, what="X")
    assert words in caught.value.message and "secret" not in caught.value.message


@pytest.mark.anyio
async def test_a_transport_failure_is_unavailable() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with client(answer) as http:
        with pytest.raises(werk.Unavailable, match="could not be reached"):
            await openai_upstream(http, "/v1/completions", BODY, stream=False, what="X")


@pytest.mark.anyio
async def test_a_stream_yields_data_payloads_split_anywhere_and_stops_at_done() -> None:
    wire = b'data: {"a":1}\n\n: ping\n\ndata: {"b"' + b":2}\r\n\r\ndata: [DONE]\n\n"
    body = Tracked([wire[:7], wire[7:30], wire[30:]])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/completions", BODY, stream=True, what="X")
        assert isinstance(reply.stream, UpstreamSSE)
        payloads = [payload async for payload in reply.stream]
        await reply.stream.aclose()
    assert payloads == [b'{"a":1}', b'{"b":2}']
    assert body.closed


@pytest.mark.anyio
async def test_closing_a_stream_early_closes_the_upstream_response() -> None:
    body = Tracked([b'data: {"a":1}\n\n', b'data: {"b":2}\n\n', b"data: [DONE]\n\n"])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/completions", BODY, stream=True, what="X")
        assert reply.stream is not None
        assert await reply.stream.__anext__() == b'{"a":1}'
        await reply.stream.aclose()  # what the host does when the client leaves
    assert body.closed


@pytest.mark.anyio
async def test_an_error_event_mid_stream_is_a_backend_error() -> None:
    body = Tracked([b'data: {"a":1}\n\n', b'data: {"error":{"message":"secret"}}\n\n'])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/completions", BODY, stream=True, what="X")
        assert reply.stream is not None
        assert await reply.stream.__anext__() == b'{"a":1}'
        with pytest.raises(werk.BackendError, match="X failed while streaming") as caught:
            await reply.stream.__anext__()
        assert "secret" not in caught.value.message
        await reply.stream.aclose()


@pytest.mark.anyio
async def test_a_stream_that_ends_without_done_is_a_backend_error() -> None:
    """The backend went away mid-reply (e.g. its engine died): the consumer must not mistake
    the truncated stream for a complete answer."""
    body = Tracked([b'data: {"a":1}\n\n', b'data: {"b"'])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/completions", BODY, stream=True, what="X")
        assert reply.stream is not None
        assert await reply.stream.__anext__() == b'{"a":1}'
        with pytest.raises(werk.BackendError, match="X ended its stream before finishing"):
            await reply.stream.__anext__()
        await reply.stream.aclose()


@pytest.mark.anyio
async def test_a_rewritten_stream_renames_json_chunks_and_closes_the_upstream() -> None:
    body = Tracked(
        [
            b'data: {"model": "theirs", "choices": []}\n\n',
            b'data: {"no_model": 1}\n\ndata: not json\n\n',
            b"data: [DONE]\n\n",
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=body)

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/chat/completions", BODY, stream=True, what="X")
        assert reply.stream is not None
        stream = werk.RewrittenStream(reply.stream, werk.renamed("ours"))
        payloads = [payload async for payload in stream]
        await stream.aclose()
    assert payloads == [b'{"model":"ours","choices":[]}', b'{"no_model":1}', b"not json"]
    assert body.closed


class Broken(httpx.AsyncByteStream):
    """A response body that loses its connection after the first event."""

    def __init__(self, error: httpx.HTTPError) -> None:
        self.error = error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b'data: {"a":1}\n\n'
        raise self.error

    async def aclose(self) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (httpx.RemoteProtocolError("peer closed"), werk.BackendError, "X broke off its stream"),
        (httpx.ReadTimeout("slow"), werk.WerkTimeout, "X stopped sending its stream"),
    ],
)
async def test_a_connection_lost_mid_stream_is_the_backends_failure(
    error: httpx.HTTPError, expected: type[werk.WerkError], words: str
) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Broken(error))

    async with client(answer) as http:
        reply = await openai_upstream(http, "/v1/completions", BODY, stream=True, what="X")
        assert reply.stream is not None
        assert await reply.stream.__anext__() == b'{"a":1}'
        with pytest.raises(expected, match=words):
            await reply.stream.__anext__()
        await reply.stream.aclose()
