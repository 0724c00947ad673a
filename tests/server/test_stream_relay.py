"""``werk.http.openai.ClosingStreamingResponse`` driven directly: the relay and the wait for
the client's disconnect run as two tasks, and whichever way the exchange ends the backend's
iterator is closed and no task is left behind. (Through a real server:
``test_contract_hardening.py``, the client that leaves mid-stream.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest

from werk.http.openai import ClosingStreamingResponse

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the server's loop (uvicorn runs on asyncio)


class Source:
    """A backend stream: ``pieces`` payloads, then waits ``pause`` before each further one."""

    def __init__(self, pieces: int, pause: float = 0.0, more: int = 0) -> None:
        self.pieces, self.pause, self.more = pieces, pause, more
        self.closed = False
        self._events = self._produce()

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def _produce(self) -> AsyncIterator[bytes]:
        for n in range(self.pieces):
            yield b'{"n": %d}' % n
        for n in range(self.more):
            await asyncio.sleep(self.pause)
            yield b'{"late": %d}' % n

    async def aclose(self) -> None:
        self.closed = True


class Client:
    """The server's side of one exchange: what was sent, and a disconnect on demand."""

    def __init__(self, fail_on_body: bool = False) -> None:
        self.sent: list[MutableMapping[str, Any]] = []
        self.gone = asyncio.Event()
        self.fail_on_body = fail_on_body

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and self.fail_on_body:
            raise OSError("the connection broke")
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.gone.set()  # uvicorn answers the pending receive once the reply is complete

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def _others() -> set[asyncio.Task[Any]]:
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_a_finished_stream_is_closed_and_its_watcher_ends_by_itself() -> None:
    source, client = Source(3), Client()
    before = _others()
    await ClosingStreamingResponse(source, "req_1")({"type": "http"}, client.receive, client.send)
    await asyncio.sleep(0)
    assert source.closed
    assert client.body().count(b"data: ") == 4 and client.body().endswith(b"data: [DONE]\n\n")
    assert _others() == before


async def test_a_client_that_leaves_before_the_first_piece_ends_the_relay_quietly() -> None:
    source, client = Source(0, pause=30.0, more=1), Client()
    before = _others()
    response = ClosingStreamingResponse(source, "req_2")
    relay = asyncio.ensure_future(response({"type": "http"}, client.receive, client.send))
    await asyncio.sleep(0.05)
    client.gone.set()
    await asyncio.wait_for(relay, 2.0)  # returns: the client left, nobody to answer
    assert source.closed
    assert client.body() == b""
    assert _others() == before


async def test_a_send_that_fails_cancels_the_watcher_and_closes_the_stream() -> None:
    source, client = Source(2), Client(fail_on_body=True)
    before = _others()
    with pytest.raises(OSError, match="the connection broke"):
        await ClosingStreamingResponse(source, "req_3")(
            {"type": "http"}, client.receive, client.send
        )
    await asyncio.sleep(0)
    assert source.closed
    assert _others() == before


async def test_a_shutdown_that_cancels_the_relay_still_cancels_it() -> None:
    source, client = Source(0, pause=30.0, more=1), Client()
    response = ClosingStreamingResponse(source, "req_4")
    relay = asyncio.ensure_future(response({"type": "http"}, client.receive, client.send))
    await asyncio.sleep(0.05)
    relay.cancel()
    with pytest.raises(asyncio.CancelledError):
        await relay
    assert source.closed
