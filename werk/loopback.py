"""A small HTTP/1.1 client for a backend child on loopback, built for the ``/v1`` hot path.

Every ``/v1`` request Werk relays crosses one loopback hop to the child. It needs one thing: send
a complete request, read a ``Content-Length``, chunked or close-delimited response, over pooled
keep-alive connections. Against a trivial server on a 2-core machine
(``benchmarks/loopback_client.py``) httpx (with httpcore and h11) takes 1.17 ms per request,
hand-written asyncio streams 0.27 ms and this client 0.30 ms.

What it guarantees:

* **Plain loopback HTTP/1.1 only**: no TLS, no proxies (environment variables are never read),
  no redirects, no compression (``Accept-Encoding: identity`` is always sent).
* **Typed failures that say whether a retry is safe.** :class:`NotSent` means no response byte
  arrived on this connection (connect refused or reset, a write error, the connection closed
  before a status line): sending again cannot make the server answer twice to the client, so a
  caller may retry once. :class:`BrokenResponse` means the failure came after the first response
  byte (half a status line, a cut body): never retry. :class:`LoopbackTimeout` covers connect,
  write and the gap between two reads.
* **Bounded**: the response head is at most 64 KiB; :meth:`LoopbackResponse.read` takes a limit.
* **A connection is reused only when its exchange ended cleanly**: the body was read to its
  end, neither side asked for ``Connection: close``, and nothing was cancelled mid-way. Anything
  else closes the socket (for a streamed generation, closing is what makes the child cancel it).

It runs on the asyncio event loop (the one uvicorn serves on; uvloop is fine) through a bare
``asyncio.Protocol``: stream wrappers cost an extra loop pass per read and write, which is
measurable on this path. One client per child: :meth:`LoopbackClient.aclose` closes every idle
connection; responses still open close their own when they end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import cast

__all__ = [
    "BrokenResponse",
    "LoopbackClient",
    "LoopbackError",
    "LoopbackResponse",
    "LoopbackTimeout",
    "NotSent",
    "ResponseTooLarge",
]

MAX_HEAD_BYTES = 64 * 1024
READ_SIZE = 256 * 1024
_NO_BODY_STATUSES = frozenset({204, 304})


class LoopbackError(Exception):
    """A loopback exchange failed; the subclass says how far it got."""


class NotSent(LoopbackError):
    """No response byte arrived: the request may be sent again (once) on a new connection."""


class BrokenResponse(LoopbackError):
    """The exchange failed after the response began (never retry: the child may have acted)."""


class LoopbackTimeout(LoopbackError):
    """Connecting, writing, or waiting for the next response bytes took too long."""


class ResponseTooLarge(LoopbackError):
    """The response body exceeded the caller's limit."""


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(LoopbackTimeout("no response bytes in time"))


class _Connection(asyncio.Protocol):
    """One socket as an asyncio protocol: received bytes wait in ``chunks`` until read, and
    ``buffer`` holds what a parser read but did not consume yet."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._ended = False
        self._reading_paused = False
        self._writing_paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > READ_SIZE and self.transport is not None:
            self.transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._wake()
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- what the client uses ----------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self._ended and self.transport is not None and not self.transport.is_closing()

    async def send(self, data: bytes, timeout: float) -> None:
        if not self.usable:
            raise NotSent("the connection is closed")
        assert self.transport is not None
        self.transport.write(data)
        if self._writing_paused:
            self._drained = asyncio.get_running_loop().create_future()
            try:
                async with asyncio.timeout(timeout):
                    await self._drained
            except TimeoutError:
                raise LoopbackTimeout("sending the request took too long") from None
            finally:
                self._drained = None
            if self._ended:
                raise NotSent("the connection closed while the request was sent")

    async def receive(self, timeout: float) -> bytes:
        """The next bytes, or ``b""`` once the connection has ended (closed or reset)."""
        if not self._chunks and not self._ended:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            # A bare timer, not asyncio.timeout(): this wait runs for every chunk of a streamed
            # reply, and the context manager's bookkeeping was 6 % of werk serve's CPU there.
            timer = loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self.take_received()

    def take_received(self) -> bytes:
        """The bytes received so far and not yet taken, without waiting (maybe ``b""``)."""
        if not self._chunks:
            return b""
        data = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class LoopbackResponse:
    """One response: status and headers are read; the body is read on demand.

    Iterate it for the body's bytes as they arrive (chunked framing removed), or :meth:`read`
    the whole body up to a limit. Always :meth:`aclose` it (``async with`` does): a fully read
    body returns the connection to the pool, anything else closes the socket.
    """

    def __init__(
        self,
        client: LoopbackClient,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
        *,
        keep_alive: bool,
        no_body: bool,
    ) -> None:
        self.status = status
        self.headers = headers
        self._client = client
        self._connection: _Connection | None = connection
        self._keep_alive = keep_alive
        self._complete = no_body
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._remaining: int | None = None
        if not no_body and not self._chunked and length is not None:
            try:
                self._remaining = int(length)
            except ValueError:
                raise BrokenResponse("the response has an invalid Content-Length") from None
            if self._remaining < 0:
                raise BrokenResponse("the response has an invalid Content-Length")
        elif not no_body and not self._chunked:
            self._keep_alive = False  # delimited by the connection's end
        if self._remaining == 0:
            self._complete = True

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    async def __aenter__(self) -> LoopbackResponse:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._body()

    async def read(self, limit: int) -> bytes:
        """The whole body (at most ``limit`` bytes, else :class:`ResponseTooLarge`)."""
        parts: list[bytes] = []
        size = 0
        async for part in self._body():
            size += len(part)
            if size > limit:
                raise ResponseTooLarge(f"the response body exceeds {limit} bytes")
            parts.append(part)
        return b"".join(parts)

    async def _body(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None or self._complete:
            return
        if self._chunked:
            async for part in self._chunks(connection):
                yield part
        elif self._remaining is not None:
            while self._remaining > 0:
                if not connection.buffer:
                    data = await connection.receive(self._client.read_timeout)
                    if not data:
                        raise BrokenResponse("the connection closed before the body's end")
                    connection.buffer = data
                part = connection.buffer[: self._remaining]
                connection.buffer = connection.buffer[len(part) :]
                self._remaining -= len(part)
                yield part
        else:
            if connection.buffer:
                part, connection.buffer = connection.buffer, b""
                yield part
            while data := await connection.receive(self._client.read_timeout):
                yield data
        self._complete = True

    async def _chunks(self, connection: _Connection) -> AsyncIterator[bytes]:
        timeout = self._client.read_timeout
        while True:
            complete = _complete_chunks(connection)
            if complete:
                yield complete
                continue
            line = await _read_line(connection, timeout)
            size = _chunk_size(line)
            if size == 0:
                while await _read_line(connection, timeout):
                    pass  # trailer fields, up to the empty line
                return
            remaining = size
            while remaining > 0:
                if not connection.buffer:
                    data = await connection.receive(timeout)
                    if not data:
                        raise BrokenResponse("the connection closed inside a chunk")
                    connection.buffer = data
                part = connection.buffer[:remaining]
                connection.buffer = connection.buffer[len(part) :]
                remaining -= len(part)
                yield part
            if await _read_line(connection, timeout):
                raise BrokenResponse("a chunk is not followed by CRLF")

    async def aclose(self) -> None:
        """Return the connection to the pool after a complete exchange, else close it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._complete and self._keep_alive and not connection.buffer:
            await self._client._release(connection)
        else:
            await connection.close()


def _chunk_size(line: bytes) -> int:
    try:
        size = int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        raise BrokenResponse("the response has an invalid chunk size") from None
    if size < 0:
        raise BrokenResponse("the response has an invalid chunk size")
    return size


def _complete_chunks(connection: _Connection) -> bytes:
    """The data of every whole chunk already received, joined, without waiting (``b""`` when
    the next chunk is not complete yet, or is the last one).

    A streamed reply's events arrive one chunk each, often several in one read; taking them
    together lets the relay pass them on in one write instead of one per event (each write to
    a client on loopback is also where that client gets scheduled). Anything unusual (a bad
    size, the last chunk) is left for the incremental path, which reads and checks it.
    """
    buffer = connection.buffer + connection.take_received()
    parts: list[bytes] = []
    start = 0
    while True:
        end = buffer.find(b"\r\n", start)
        if end < 0:
            break
        try:
            size = int(buffer[start:end].split(b";", 1)[0].strip(), 16)
        except ValueError:
            break
        data_start = end + 2
        data_end = data_start + size
        if size <= 0 or buffer[data_end : data_end + 2] != b"\r\n":
            break  # the last chunk, a bad one, or one not complete yet
        parts.append(buffer[data_start:data_end])
        start = data_end + 2
    connection.buffer = buffer[start:] if start else buffer
    return parts[0] if len(parts) == 1 else b"".join(parts)


async def _read_line(connection: _Connection, timeout: float) -> bytes:
    """One CRLF-terminated line of chunked framing (without the CRLF)."""
    while True:
        end = connection.buffer.find(b"\r\n")
        if end >= 0:
            line = connection.buffer[:end]
            connection.buffer = connection.buffer[end + 2 :]
            return line
        if len(connection.buffer) > MAX_HEAD_BYTES:
            raise BrokenResponse("a chunk header is too long")
        data = await connection.receive(timeout)
        if not data:
            raise BrokenResponse("the connection closed inside the chunked body")
        connection.buffer += data


class LoopbackClient:
    """Pooled keep-alive HTTP/1.1 connections to one ``host:port``: a backend child on
    loopback, or an endpoint operated elsewhere that is reached over plain HTTP.

    :param host: the server's address (``127.0.0.1``; an IPv6 address with or without
        brackets).
    :param port: its port.
    :param headers: sent with every request (e.g. the child's ``Authorization``).
    :param connect_timeout: seconds for a TCP connect.
    :param write_timeout: seconds for sending one request.
    :param read_timeout: the longest wait for the next response bytes (a slow generation is
        fine as long as bytes keep coming).
    :param max_idle: idle connections kept for reuse (more are closed).
    :param spare: connected idle connections kept ready (at most ``max_idle``): whenever a
        request leaves fewer usable ones in the pool, one is connected in the background. A
        server that closes the connection after every response of some kind (llama-server
        after each streamed one) then costs the next request no connect; a spare the server
        closed while idle (its keep-alive timeout) is replaced the same way, and one that dies
        as a request is sent on it is a :class:`NotSent` like any pooled connection's.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
        write_timeout: float = 60.0,
        read_timeout: float = 600.0,
        max_idle: int = 16,
        spare: int = 0,
    ) -> None:
        self.host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        self.port = port
        self.connect_timeout = connect_timeout
        self.write_timeout = write_timeout
        self.read_timeout = read_timeout
        self.max_idle = max_idle
        self.spare = min(spare, max_idle)
        named = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 address
        fixed = {"Host": f"{named}:{port}", "Accept-Encoding": "identity", **(headers or {})}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode()
        self._idle: list[_Connection] = []
        self._closed = False
        self._refill: asyncio.Task[None] | None = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        content_type: str = "application/json",
        fresh: bool = False,
    ) -> LoopbackResponse:
        """Send one request and read the response head.

        :param fresh: use a new connection even if an idle one is pooled (the one retry after
            :class:`NotSent`).
        :raises NotSent: no response byte arrived (safe to send once more, ``fresh=True``).
        :raises BrokenResponse: the response began but is malformed or cut.
        :raises LoopbackTimeout: connect, write or read took too long.
        """
        if self._closed:
            raise NotSent("the loopback client is closed")
        connection = None
        while not fresh and self._idle and connection is None:
            connection = self._idle.pop()
            if not connection.usable:  # the child closed it while it was idle
                await connection.close()
                connection = None
        if connection is None:
            connection = await self._connect()
        if self.spare:
            self._keep_spare()
        head = (
            f"{method} {path} HTTP/1.1\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n"
        ).encode()
        try:
            await connection.send(head + self._fixed + b"\r\n" + body, self.write_timeout)
            return await self._response(connection, no_body=method == "HEAD")
        except BaseException:
            await connection.close()
            raise

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        timeout: float,
        limit: int = 16 * 1024 * 1024,
    ) -> tuple[int, bytes]:
        """One whole exchange for a small control request (health, a listing, a load):
        ``(status, body)``, everything bounded by ``timeout`` seconds.

        :raises LoopbackError: as :meth:`request` and :meth:`LoopbackResponse.read`; running
            out of ``timeout`` is a :class:`LoopbackTimeout`.
        """
        try:
            async with asyncio.timeout(timeout):
                async with await self.request(method, path, body=body) as response:
                    return response.status, await response.read(limit)
        except TimeoutError:
            raise LoopbackTimeout(f"{method} {path} took longer than {timeout} s") from None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(_Connection, self.host, self.port)
        except TimeoutError:
            raise LoopbackTimeout(f"connecting to {self.host}:{self.port} took too long") from None
        except OSError as exc:
            raise NotSent(f"could not connect to {self.host}:{self.port}: {exc}") from None
        return connection

    def _keep_spare(self) -> None:
        """Start connecting a spare unless the pool holds enough usable idle connections (dead
        ones are dropped from it here) or one is being connected already."""
        if self._closed or (self._refill is not None and not self._refill.done()):
            return
        dead = [c for c in self._idle if not c.usable]
        if dead:
            self._idle = [c for c in self._idle if c.usable]
            for connection in dead:
                if connection.transport is not None:
                    connection.transport.close()
        if len(self._idle) < self.spare:
            self._refill = asyncio.get_running_loop().create_task(self._connect_spare())

    async def _connect_spare(self) -> None:
        try:
            connection = await self._connect()
        except LoopbackError:
            return  # the next request connects itself and reports what fails
        if self._closed or len(self._idle) >= self.max_idle:
            await connection.close()
        else:
            self._idle.insert(0, connection)  # warm keep-alive connections are taken first

    async def _response(
        self, connection: _Connection, *, no_body: bool, started: bool = False
    ) -> LoopbackResponse:
        buffer = connection.buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(buffer) > MAX_HEAD_BYTES:
                raise BrokenResponse("the response head is too long")
            data = await connection.receive(self.read_timeout)
            if not data:
                if buffer or started:
                    raise BrokenResponse("the connection closed inside the response head")
                raise NotSent("the connection closed before any response byte")
            buffer += data
        connection.buffer = buffer[end + 4 :]
        lines = buffer[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise BrokenResponse("the response has an invalid status line")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BrokenResponse("the response has an invalid header line")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:  # an interim response (100 Continue): the real one follows
            return await self._response(connection, no_body=no_body, started=True)
        connection_header = headers.get("connection", "").lower()
        keep_alive = "close" not in connection_header and (
            parts[0] != "HTTP/1.0" or "keep-alive" in connection_header
        )
        return LoopbackResponse(
            self,
            connection,
            status,
            headers,
            keep_alive=keep_alive,
            no_body=no_body or status in _NO_BODY_STATUSES,
        )

    async def _release(self, connection: _Connection) -> None:
        if self._closed or len(self._idle) >= self.max_idle or not connection.usable:
            await connection.close()
        else:
            self._idle.append(connection)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def aclose(self) -> None:
        """Close every idle connection; the client refuses new requests afterwards."""
        self._closed = True
        if self._refill is not None:
            self._refill.cancel()
            await asyncio.gather(self._refill, return_exceptions=True)
        idle, self._idle = self._idle, []
        for connection in idle:
            await connection.close()
