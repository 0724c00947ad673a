"""Slot bookkeeping and the llama-server HTTP helper (werk_llamacpp.slots), without llama-server.

The allocator is plain bookkeeping; the HTTP helper is exercised against real loopback sockets
that misbehave the way this llama-server build does (closing a kept-alive connection without
answering), or answer with its error shapes.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from test_llamacpp_states_support import loopback_to
from werk_llamacpp.handle import LlamaHandle
from werk_llamacpp.slots import (
    LlamaRefused,
    SlotAllocator,
    check_state_slot,
    llama_json,
    new_slot_filename,
    new_slot_filename_ok,
)

from werk import BackendError, LoopbackClient, Unavailable

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_the_allocator_prefers_free_slots_then_the_least_recently_used() -> None:
    allocator = SlotAllocator((3, 4))
    a = allocator.acquire()
    b = allocator.acquire()
    assert {a[0], b[0]} == {3, 4}
    allocator.touch(a[0])
    c = allocator.acquire()  # evicts b's slot, the least recently used
    assert c[0] == b[0] and c[1] == b[1] + 1
    assert not allocator.current(*b) and allocator.current(*c) and allocator.current(*a)
    allocator.retire(a[0])
    assert not allocator.current(*a)
    d = allocator.acquire()  # the retired slot is free again and comes first
    assert d[0] == a[0] and allocator.current(*d)
    with pytest.raises(ValueError, match="distinct"):
        SlotAllocator(())
    with pytest.raises(ValueError, match="distinct"):
        SlotAllocator((1, 1))


@contextlib.asynccontextmanager
async def _client(base_url: str) -> AsyncIterator[LoopbackClient]:
    """Like the process layer's pooled client: the host's loopback client to the child."""
    client = loopback_to(base_url)
    try:
        yield client
    finally:
        await client.aclose()


def _handle(base_url: str, tmp_path: Path, http: LoopbackClient) -> LlamaHandle:
    return LlamaHandle(
        base_url=base_url,
        api_key="k",
        http=http,
        pid=0,
        generation="g_test",
        slot_dir=tmp_path,
        total_slots=2,
        state_slots=(1,),
        help_text="",
        args=(),
        log_path=tmp_path / "log",
    )


async def test_slot_ids_are_validated_because_the_server_wraps_them(tmp_path: Path) -> None:
    async with _client("http://127.0.0.1:9") as http:
        handle = _handle("http://127.0.0.1:9", tmp_path, http)
        assert check_state_slot(handle, 1) == 1
        for bad in (0, 2, 3, -1, True):
            with pytest.raises(BackendError):
                check_state_slot(handle, bad)


def test_slot_file_names_are_werk_generated_only() -> None:
    name = new_slot_filename("probe")
    assert new_slot_filename_ok(name) == name and name != new_slot_filename("probe")
    for bad in ("../x", "werk-probe-../../etc.slot", "a/b", name + "/", "x" + name):
        with pytest.raises(BackendError):
            new_slot_filename_ok(bad)
    with pytest.raises(ValueError):
        new_slot_filename("Bad")


class _Server:
    """A loopback HTTP/1.1 server: per connection, the next scripted action."""

    def __init__(self, actions: list[str]) -> None:
        self.actions = actions
        self.requests = 0
        self.released = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.actions:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                while self.actions:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    self.requests += 1
                    action = self.actions.pop(0)
                    if action == "drop":
                        break  # close without a response byte
                    if action == "silent":
                        self.released.wait(10)  # answer nothing until the test is done
                        break
                    status, body = action.split(" ", 1)
                    conn.sendall(
                        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
                    )

    def close(self) -> None:
        self.released.set()
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture
def server_factory() -> Iterator[list[_Server]]:
    made: list[_Server] = []
    yield made
    for server in made:
        server.close()


async def test_a_connection_dropped_before_any_response_is_retried_once(
    tmp_path: Path, server_factory: list[_Server]
) -> None:
    server = _Server(["200 {}", "drop", '200 {"n_erased": 7}'])
    server_factory.append(server)
    async with _client(server.url) as http:
        handle = _handle(server.url, tmp_path, http)
        assert await llama_json(handle, "GET", "/a", "first") == {}
        # The kept-alive connection is closed by the server without an answer: one retry.
        assert await llama_json(handle, "POST", "/b", "second") == {"n_erased": 7}
    assert server.requests == 3


async def test_a_second_drop_is_unavailable(tmp_path: Path, server_factory: list[_Server]) -> None:
    server = _Server(["drop", "drop"])
    server_factory.append(server)
    async with _client(server.url) as http:
        with pytest.raises(Unavailable):
            await llama_json(_handle(server.url, tmp_path, http), "GET", "/", "x")
    assert server.requests == 2


async def test_error_bodies_become_refusals_and_junk_a_backend_error(
    tmp_path: Path, server_factory: list[_Server]
) -> None:
    error = {"error": {"code": 400, "message": "secret detail", "type": "invalid_request_error"}}
    server = _Server([f"400 {json.dumps(error)}", "200 not json"])
    server_factory.append(server)
    async with _client(server.url) as http:
        handle = _handle(server.url, tmp_path, http)
        with pytest.raises(LlamaRefused) as refused:
            await llama_json(handle, "POST", "/slots/1?action=restore", "slot restore")
        assert refused.value.summary == (
            "llama-server refused slot restore (HTTP 400 invalid_request_error)"
        )
        assert "secret" not in refused.value.summary
        with pytest.raises(BackendError, match="not JSON"):
            await llama_json(handle, "GET", "/", "x")


async def test_a_dead_child_is_unavailable(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with _client(url) as http:
        with pytest.raises(Unavailable, match="not answering"):
            await llama_json(_handle(url, tmp_path, http), "GET", "/", "x")


async def test_a_call_is_bounded_by_its_own_timeout(
    tmp_path: Path, server_factory: list[_Server]
) -> None:
    """The server reads the request and says nothing: the call fails after its own bound (not
    the client's read wait, which is as long as a prefill may take)."""
    server = _Server(["silent"])
    server_factory.append(server)
    async with _client(server.url) as http:
        with anyio.fail_after(5), pytest.raises(BackendError, match="did not finish x in time"):
            await llama_json(_handle(server.url, tmp_path, http), "GET", "/", "x", timeout=0.3)
    assert server.requests == 1  # a timeout is not retried
