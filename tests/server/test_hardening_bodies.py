"""The bad-body battery against a real ``werk serve`` (API-key mode, testkv model ``kv``).

Every bad body sent to a POST route — empty, malformed, 100k-deep, a 5,000-digit integer, NaN,
invalid UTF-8, the wrong content type, over the route's bound with an honest length, a 1 GiB
chunked stream, broken framing — is answered 400, 413 or 415 with the JSON error body (never a
500, never a traceback in the log), and the server's resident memory stays bounded while the
battery runs. Raw sockets are used where an HTTP client would refuse to send the request.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from _server import ErrorBodyCheck, WerkServer, import_model, werk_serve

from werk.http.openai import OPENAI_BODY
from werk.http.routes import PROMPT_BODY, SMALL_BODY
from werk.http.server import MAX_HEAD_BYTES
from werk.protocol.media import MAX_AUDIO_BYTES, MAX_IMAGE_UPLOAD_BYTES

KEY = "bodies-key-0123456789abcdef"
AUTH = f"Authorization: Bearer {KEY}\r\n"
MIB = 1024 * 1024
GIB = 1024 * MIB
RSS_GROWTH_BOUND = 200 * MIB
HEADER_TIMEOUT = 2.0

HUGE_INT = b"9" * 5000


@dataclass(frozen=True)
class Target:
    """A POST route, its body bound, and a body template whose ``@`` is replaced by a value."""

    path: str
    limit: int
    number: bytes  # ``@`` where a JSON number belongs
    text: bytes  # ``@`` inside a JSON string


TARGETS = (
    Target(
        "/werk/v1/prefill",
        PROMPT_BODY,
        b'{"model": "kv", "prompt": "hi", "policy": {"ttl_seconds": @}}',
        b'{"model": "kv", "prompt": "@", "allow_experimental": true}',
    ),
    Target(
        "/werk/v1/decode",
        SMALL_BODY,
        b'{"handoff": "wh_0123456789abcdefgh", "max_tokens": @}',
        b'{"handoff": "wh_0123456789abcdefgh", "stop": ["@"]}',
    ),
    Target(
        "/werk/v1/states/prune",
        SMALL_BODY,
        b'{"filter": {"older_than_seconds": @}}',
        b'{"filter": {"model": "@"}}',
    ),
    Target(
        "/v1/chat/completions",
        OPENAI_BODY,
        b'{"model": "kv", "messages": [{"role": "user", "content": "hi"}], "max_tokens": @}',
        b'{"model": "kv", "messages": [{"role": "user", "content": "@"}]}',
    ),
)
IDS = [t.path for t in TARGETS]


def _bodies(target: Target) -> dict[str, bytes]:
    """The malformed bodies, each with the fault where the route's parser will meet it."""
    return {
        "empty": b"",
        "whitespace": b" \r\n\t ",
        "invalid JSON": b"{not json}",
        "truncated JSON": target.text.replace(b"@", b"abc")[:-3],
        "trailing garbage": target.text.replace(b"@", b"abc") + b" }{",
        "100k-deep arrays": b"[" * 100_000,
        "100k-deep objects": b'{"a":' * 100_000,
        "100k-deep in a field": target.number.replace(b"@", b"[" * 100_000),
        "5,000-digit integer": HUGE_INT,
        "5,000-digit integer in a field": target.number.replace(b"@", HUGE_INT),
        "5,000-digit negative in a field": target.number.replace(b"@", b"-" + HUGE_INT),
        "NaN": b"NaN",
        "NaN in a field": target.number.replace(b"@", b"NaN"),
        "Infinity in a field": target.number.replace(b"@", b"Infinity"),
        "1e999 in a field": target.number.replace(b"@", b"1e999"),
        "invalid UTF-8 in a string": target.text.replace(b"@", b"\xff\xfe\xc3\x28"),
        "invalid UTF-8 outside strings": b"\xff" + target.text,
        "UTF-8 byte-order mark": b"\xef\xbb\xbf" + target.text.replace(b"@", b"hi"),
        "UTF-16 body": target.text.replace(b"@", b"hi").decode().encode("utf-16"),
        "lone surrogate escape": target.text.replace(b"@", b"\\ud800"),
        "array instead of object": b"[]",
        "string instead of object": b'"hello"',
        "null": b"null",
    }


@dataclass
class RssSampler:
    """Samples the server's resident set size every 20 ms in a thread; keeps the peak."""

    process: psutil.Process
    baseline: int = 0
    peak: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.wait(0.02):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return


@dataclass
class Battery:
    server: WerkServer
    port: int
    rss: RssSampler


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory, testkv_site: Path) -> Iterator[Battery]:
    home = tmp_path_factory.mktemp("bodies") / "home"
    home.mkdir()
    import_model(home, testkv_site, "kv")
    args = ["--model", "kv", "--api-key", KEY, "--header-timeout", str(HEADER_TIMEOUT)]
    with werk_serve(home, testkv_site, args) as server:
        with server.client(KEY) as http:  # warm up: imports, model start, first responses
            assert http.get("/werk/v1/info").status_code == 200
            prefill = {"model": "kv", "prompt": "warm", "allow_experimental": True}
            assert http.post("/werk/v1/prefill", json=prefill).status_code == 200
        process = psutil.Process(server.process.pid)
        sampler = RssSampler(process, baseline=process.memory_info().rss)
        sampler.peak = sampler.baseline
        thread = threading.Thread(target=sampler.run, daemon=True)
        thread.start()
        try:
            yield Battery(server, int(server.base_url.rsplit(":", 1)[1]), sampler)
        finally:
            sampler.stop.set()
            thread.join()


# -- raw HTTP ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def _parse(buffer: bytes) -> tuple[list[RawResponse], bytes]:
    """Complete responses at the start of ``buffer`` (``Content-Length`` framed) and the rest."""
    responses = []
    while b"\r\n\r\n" in buffer:
        head, _, rest = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        if len(rest) < length:
            break
        responses.append(RawResponse(int(lines[0].split()[1]), headers, rest[:length]))
        buffer = rest[length:]
    return responses, buffer


def _read_until_closed(sock: socket.socket, timeout: float = 30) -> tuple[list[RawResponse], bool]:
    """Every response until the server closes (``True``) or ``timeout`` passes (``False``)."""
    sock.settimeout(timeout)
    buffer = b""
    closed = False
    try:
        while chunk := sock.recv(65536):
            buffer += chunk
        closed = True
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    responses, rest = _parse(buffer)
    assert not rest, rest[:200]
    return responses, closed


def _read_one(sock: socket.socket, timeout: float = 30) -> RawResponse:
    """The first complete response (the connection may stay open)."""
    sock.settimeout(timeout)
    buffer = b""
    while True:
        responses, _ = _parse(buffer)
        if responses:
            return responses[0]
        chunk = sock.recv(65536)
        assert chunk, f"closed without a response: {buffer[:200]!r}"
        buffer += chunk


def _head(path: str, *lines: str, auth: str = AUTH) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}" + "".join(lines) + "\r\n").encode()


def _check(
    error_body: ErrorBodyCheck, b: Battery, response: RawResponse, *expected: int
) -> dict[str, object]:
    return error_body(b.server, response.status, response.headers, response.body, expected)


# -- the battery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_malformed_bodies_are_400_or_413(
    battery: Battery, error_body: ErrorBodyCheck, target: Target
) -> None:
    """Each malformed body gets 400 (413 where the body alone is over the route's bound)."""
    with battery.server.client(KEY) as http:
        for name, body in _bodies(target).items():
            response = http.post(
                target.path, content=body, headers={"Content-Type": "application/json"}
            )
            expected = 413 if len(body) > target.limit else 400
            assert response.status_code == expected, (name, response.text[:300])
            error = error_body.response(battery.server, response, expected)
            code = "payload_too_large" if expected == 413 else "invalid_request"
            assert error["code"] == code, (name, error)


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_wrong_content_type_is_415(
    battery: Battery, error_body: ErrorBodyCheck, target: Target
) -> None:
    good = target.text.replace(b"@", b"hi")
    content_types: dict[str, dict[str, str]] = {
        "text/plain": {"Content-Type": "text/plain"},
        "none": {},
        "form": {"Content-Type": "application/x-www-form-urlencoded"},
        "multipart": {"Content-Type": "multipart/form-data; boundary=x"},
        "json suffix": {"Content-Type": "application/json-seq"},
        "empty": {"Content-Type": ""},
    }
    with battery.server.client(KEY) as http:
        for name, headers in content_types.items():
            request = http.build_request("POST", target.path, content=good, headers=headers)
            if name == "none":
                assert "content-type" not in request.headers
            response = http.send(request)
            error = error_body.response(battery.server, response, 415)
            assert error["code"] == "invalid_request", (name, error)
        # The right type with parameters is accepted: the refusals above are about the type.
        fine = http.post(
            target.path,
            content=good,
            headers={"Content-Type": "application/json; charset=utf-8"},
        )
        assert fine.status_code != 415, fine.text


def _declared_over(
    battery: Battery, error_body: ErrorBodyCheck, path: str, media: str, limit: int
) -> None:
    """Announce ``limit + 1`` body bytes, send 1 KiB of them: a 413 ``payload_too_large`` that
    closes the connection must come back (a server that waited for the rest would never
    answer)."""
    with socket.create_connection(("127.0.0.1", battery.port)) as sock:
        head = _head(path, f"Content-Type: {media}\r\n", f"Content-Length: {limit + 1}\r\n")
        sock.sendall(head + b" " * 1024)
        response = _read_one(sock)
    error = _check(error_body, battery, response, 413)
    assert error["code"] == "payload_too_large"
    assert response.headers["connection"] == "close"  # the unread body ends the connection


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_declared_length_over_the_bound_is_refused_before_the_body_is_read(
    battery: Battery, error_body: ErrorBodyCheck, target: Target
) -> None:
    """An honest ``Content-Length`` over the bound is answered 413 after 1 KiB of the body has
    been sent."""
    _declared_over(battery, error_body, target.path, "application/json", target.limit)


UPLOADS = (
    ("/v1/audio/transcriptions", MAX_AUDIO_BYTES + 64 * 1024),
    ("/v1/images/edits", MAX_IMAGE_UPLOAD_BYTES + 64 * 1024),
)


@pytest.mark.parametrize(("path", "limit"), UPLOADS, ids=[path for path, _ in UPLOADS])
def test_an_upload_declared_over_its_bound_is_refused_before_the_body_is_read(
    battery: Battery, error_body: ErrorBodyCheck, path: str, limit: int
) -> None:
    """The multipart upload routes refuse an over-bound ``Content-Length`` as the JSON routes
    do (the test above)."""
    _declared_over(battery, error_body, path, "multipart/form-data; boundary=x", limit)


def _stream_chunked(sock: socket.socket, total: int) -> tuple[int, str]:
    """Send up to ``total`` bytes of chunked body in 1 MiB chunks, stopping as soon as the
    server answers (or closes). Returns the body bytes sent and why sending stopped."""
    chunk = b"%x\r\n" % MIB + b"[" * MIB + b"\r\n"
    sent = 0
    sock.settimeout(30)
    while sent < total:
        if select.select([sock], [], [], 0)[0]:
            return sent, "answered"
        try:
            sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            return sent, "closed"
        sent += MIB
    return sent, "finished"


@pytest.mark.parametrize("target", TARGETS, ids=IDS)
def test_one_gib_chunked_body_is_cut_off_at_the_bound(
    battery: Battery, error_body: ErrorBodyCheck, target: Target
) -> None:
    """A 1 GiB chunked body (no ``Content-Length``) is answered 413 once the bound is crossed,
    long before 1 GiB is sent, and the connection is closed rather than drained."""
    with socket.create_connection(("127.0.0.1", battery.port)) as sock:
        sock.sendall(
            _head(
                target.path, "Content-Type: application/json\r\n", "Transfer-Encoding: chunked\r\n"
            )
        )
        sent, why = _stream_chunked(sock, GIB)
        responses, closed = _read_until_closed(sock)
    print(
        f"\n{target.path}: 413 after {sent / MIB:.0f} MiB sent ({why}); "
        f"bound {target.limit / MIB:g} MiB"
    )
    assert why != "finished", "the server let a whole 1 GiB body through"
    assert sent <= target.limit + 64 * MIB, "the server read far past the bound"
    assert closed, "the server kept the connection open after refusing the body"
    assert len(responses) == 1
    assert _check(error_body, battery, responses[0], 413)["code"] == "payload_too_large"


def test_chunked_body_with_a_wrong_key_is_refused_without_reading_it(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    with socket.create_connection(("127.0.0.1", battery.port)) as sock:
        sock.sendall(
            _head(
                "/werk/v1/prefill",
                "Content-Type: application/json\r\n",
                "Transfer-Encoding: chunked\r\n",
                auth="Authorization: Bearer wrong\r\n",
            )
        )
        sent, why = _stream_chunked(sock, GIB)
        responses, closed = _read_until_closed(sock)
    assert why != "finished" and sent < PROMPT_BODY
    assert closed
    assert _check(error_body, battery, responses[0], 401)["code"] == "unauthenticated"


def test_httpx_streaming_client_sees_the_413(battery: Battery, error_body: ErrorBodyCheck) -> None:
    """An ordinary client streaming a 1 GiB body from a generator gets the 413 (the server
    closes; httpx then reads the answer) and stops pulling from the generator."""
    pulled = 0

    def body() -> Iterator[bytes]:
        nonlocal pulled
        block = b"1," * (MIB // 2)
        yield b"["
        while pulled < GIB:
            pulled += len(block)
            yield block

    with battery.server.client(KEY) as http:
        response = http.post(
            "/werk/v1/decode", content=body(), headers={"Content-Type": "application/json"}
        )
    assert error_body.response(battery.server, response, 413)["code"] == "payload_too_large"
    assert pulled < GIB


def test_whole_float_integers_are_integers_and_nothing_else_is(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """JSON (and the OpenAPI 3.1 document) count ``64.0`` as the integer 64: it passes
    validation (the unknown handoff then answers 410). Fractions, strings, booleans and floats
    too large to be exact are still 400."""
    handoff = "wh_0123456789abcdefgh"
    with battery.server.client(KEY) as http:
        for value in (64, 64.0, 6.4e1):
            response = http.post("/werk/v1/decode", json={"handoff": handoff, "max_tokens": value})
            assert error_body.response(battery.server, response, 410)["code"] == "invalid_handoff"
        for raw in (b"64.5", b'"64"', b"true", b"1e300", b"-0.5"):
            body = b'{"handoff": "%s", "max_tokens": %s}' % (handoff.encode(), raw)
            response = http.post(
                "/werk/v1/decode", content=body, headers={"Content-Type": "application/json"}
            )
            error = error_body.response(battery.server, response, 400)
            assert "max_tokens" in str(error["message"]), (raw, error)


# -- framing -------------------------------------------------------------------------------------


def _exchange(battery: Battery, request: bytes) -> tuple[list[RawResponse], bool]:
    with socket.create_connection(("127.0.0.1", battery.port)) as sock:
        sock.sendall(request)
        return _read_until_closed(sock)


DECODE = b'{"handoff": "wh_0123456789abcdefgh"}'
JSON = "Content-Type: application/json\r\n"


def test_false_short_content_length_then_garbage(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """``Content-Length`` shorter than the body: the server parses the declared bytes (400,
    truncated JSON); the rest is read as the next request, which is malformed (400, close)."""
    request = _head("/werk/v1/decode", JSON, "Content-Length: 10\r\n") + DECODE + b"\r\n\r\n"
    responses, closed = _exchange(battery, request)
    assert closed
    assert [r.status for r in responses] == [400, 400]
    for response in responses:
        assert _check(error_body, battery, response, 400)["code"] == "invalid_request"


def test_pipelined_requests_are_answered_before_the_garbage_behind_them_is_refused(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """Two complete requests and then bytes that are no request, in one write: both requests
    are answered in order, then the garbage gets the JSON 400 and the connection closes."""
    info = f"GET /werk/v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n".encode()
    responses, closed = _exchange(battery, info + info + b"\x00\x01 garbage\r\n\r\n")
    assert closed
    assert [r.status for r in responses] == [200, 200, 400]
    assert _check(error_body, battery, responses[2], 400)["code"] == "invalid_request"


def _padded_info(size: int) -> bytes:
    """A GET of /werk/v1/info whose headers carry ``size`` bytes of padding, give or take 1 KiB."""
    padding = "".join(f"X-Pad-{i}: {'a' * 1000}\r\n" for i in range(size // 1024))
    return f"GET /werk/v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}{padding}\r\n".encode()


def _first_answer(battery: Battery, request: bytes) -> RawResponse:
    with socket.create_connection(("127.0.0.1", battery.port)) as sock:
        sock.sendall(request)
        return _read_one(sock)


def test_a_request_head_of_60_kib_is_served(battery: Battery) -> None:
    """Request line and headers together may carry ``werk.http.server.MAX_HEAD_BYTES``."""
    assert MAX_HEAD_BYTES == 64 * 1024
    assert _first_answer(battery, _padded_info(60 * 1024)).status == 200


def test_a_request_head_over_64_kib_is_refused(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """The parser itself sets no bound on a request head; over 64 KiB is a 400, then close."""
    response = _first_answer(battery, _padded_info(70 * 1024))
    assert _check(error_body, battery, response, 400)["code"] == "invalid_request"
    assert response.headers["connection"] == "close"


def test_false_short_content_length_then_bytes_that_cannot_start_a_request(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """The rest starts with a byte no request line starts with (``:``): refused at once (400,
    close) once the declared request is answered, without waiting for a line break."""
    request = _head("/werk/v1/decode", JSON, "Content-Length: 10\r\n") + DECODE
    responses, closed = _exchange(battery, request)
    assert closed, "the leftover bytes held the connection open"
    assert [r.status for r in responses] == [400, 400]
    for response in responses:
        assert _check(error_body, battery, response, 400)["code"] == "invalid_request"


def test_false_short_content_length_then_an_unfinished_line(
    battery: Battery, error_body: ErrorBodyCheck
) -> None:
    """The rest is the start of a request line that never ends: the header deadline closes
    the connection after the declared request's answer."""
    body = DECODE[:10] + b"GET /werk/v1/info HTT"
    request = _head("/werk/v1/decode", JSON, "Content-Length: 10\r\n") + body
    responses, closed = _exchange(battery, request)
    assert closed, "the leftover bytes held the connection open"
    assert [r.status for r in responses] == [400]
    assert _check(error_body, battery, responses[0], 400)["code"] == "invalid_request"


FRAMING = {
    "Content-Length and chunked": (
        JSON + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"0\r\n\r\n",
    ),
    "non-numeric Content-Length": (JSON + "Content-Length: abc\r\n", b"{}"),
    "negative Content-Length": (JSON + "Content-Length: -1\r\n", b"{}"),
    "two Content-Lengths": (JSON + "Content-Length: 2\r\nContent-Length: 3\r\n", b"{}"),
    "unknown Transfer-Encoding": (JSON + "Transfer-Encoding: gzip\r\n", b"{}"),
    "malformed chunk size": (JSON + "Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n"),
}


@pytest.mark.parametrize("name", FRAMING)
def test_broken_framing_is_400_and_closed(
    battery: Battery, error_body: ErrorBodyCheck, name: str
) -> None:
    headers, body = FRAMING[name]
    responses, closed = _exchange(battery, _head("/werk/v1/decode", headers) + body)
    assert closed, name
    assert [r.status for r in responses] == [400], name
    assert _check(error_body, battery, responses[0], 400)["code"] == "invalid_request"


def test_garbage_request_line_is_400(battery: Battery, error_body: ErrorBodyCheck) -> None:
    responses, closed = _exchange(battery, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")
    assert closed
    assert [r.status for r in responses] == [400]
    _check(error_body, battery, responses[0], 400)


# -- the whole module ----------------------------------------------------------------------------


def test_server_memory_stayed_bounded_and_nothing_crashed(battery: Battery) -> None:
    """Runs last in this module: resident memory grew by less than 200 MiB at its peak (a 1 GiB
    body held anywhere would show), the server is alive, and its log has no traceback."""
    time.sleep(0.1)
    now = battery.rss.process.memory_info().rss
    baseline, peak = battery.rss.baseline, max(battery.rss.peak, now)
    print(
        f"\nserver RSS: baseline {baseline / MIB:.1f} MiB, peak {peak / MIB:.1f} MiB, "
        f"after {now / MIB:.1f} MiB"
    )
    assert peak - baseline < RSS_GROWTH_BOUND
    assert now - baseline < RSS_GROWTH_BOUND
    assert battery.server.process.poll() is None
    log = battery.server.log()
    assert "Traceback" not in log
    assert "unhandled exception" not in log
    with battery.server.client(KEY) as http:
        assert http.get("/werk/v1/info").status_code == 200
