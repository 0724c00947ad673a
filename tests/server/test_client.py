"""The bundled ``werk.client.WerkClient`` against a live ``werk serve`` and hostile fakes.

The live server checks that typed methods round-trip and that server errors come back as the
same :class:`werk.WerkError` subclass (code, capability, retryability, request id). Small
``http.server`` / raw-socket fakes on loopback check the transport rules: no redirect is ever
followed (the target is never contacted), response bodies are bounded, and a silent server
is a :class:`werk.WerkTimeout`.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from _server import WerkServer, free_port

from werk.client import MAX_RESPONSE_BYTES, WerkClient
from werk.protocol import (
    CapabilityStatus,
    DecodeRequest,
    ErrorCode,
    ExpertActionRequest,
    IncompatibleState,
    InvalidHandoff,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    PinRequest,
    Policy,
    PrefillRequest,
    PruneRequest,
    Retention,
    Reuse,
    ReuseOutcome,
    ReuseUnavailable,
    Tier,
    TierRequest,
    Unauthenticated,
    Unavailable,
    Unsupported,
    WerkError,
    WerkTimeout,
)

KEY = "client-test-key-27182818"
DISK_PREFER = Policy(retention=Retention.DISK, reuse=Reuse.PREFER)


@pytest.fixture(scope="module")
def server(spawn_server: Callable[..., WerkServer]) -> WerkServer:
    return spawn_server(keys=[KEY])


@pytest.fixture
def client(server: WerkServer) -> Iterator[WerkClient]:
    with WerkClient(server.base_url, api_key=KEY, timeout=30) as c:
        yield c


def _assert_error(exc: WerkError, cls: type[WerkError], capability: str | None = None) -> None:
    assert type(exc) is cls
    assert exc.request_id is not None and exc.request_id.startswith("req_")
    assert exc.capability == capability


# -- live server -----------------------------------------------------------------------------


def test_typed_methods_round_trip(client: WerkClient) -> None:
    info = client.info()
    assert info.server.auth.value == "api_key" and [m.id for m in info.models] == ["kv"]
    assert client.models().models[0].id == "kv"
    assert client.memory().pressure is not None
    assert client.set_residency("kv", resident=True).resident is True
    assert client.set_residency("kv", resident=False, dry_run=True).resident is True
    rows = client.capabilities(model="kv").capabilities
    assert {r.id: r.status for r in rows if r.model == "kv"}["runtime.pd.prefill"] is (
        CapabilityStatus.EXPERIMENTAL
    )

    made = client.prefill(
        PrefillRequest(
            model="kv", prompt="client prompt", policy=DISK_PREFER, allow_experimental=True
        )
    )
    assert made.state is not None and made.state.tier is Tier.DISK
    assert made.reuse.outcome is ReuseOutcome.FRESH
    state_id = made.state.id
    listed = client.list_states(model="kv", tier=Tier.DISK, pinned=False).states
    assert [s.id for s in listed] == [state_id]
    assert client.list_states(pinned=True).states == []
    assert client.list_states(tier=Tier.BACKEND).states == []
    inspected = client.inspect_state(state_id)
    assert inspected == listed[0]
    preview = client.pin_state(state_id, PinRequest(pinned=True))
    assert preview.dry_run and preview.state.pinned
    assert not client.inspect_state(state_id).pinned

    again = client.prefill(
        PrefillRequest(
            model="kv", prompt="client prompt", policy=DISK_PREFER, allow_experimental=True
        )
    )
    assert again.reuse.outcome is ReuseOutcome.REUSED and again.reuse.state_id == state_id
    for handoff in (made.handoff, again.handoff):
        decoded = client.decode(DecodeRequest(handoff=handoff.token, max_tokens=4))
        assert decoded.text and decoded.usage.completion_tokens <= 4
    preview_prune = client.prune_states(PruneRequest(ids=[state_id]))
    assert preview_prune.dry_run and preview_prune.selected == [state_id]
    done = client.prune_states(PruneRequest(ids=[state_id], dry_run=False))
    assert done.deleted == [state_id]
    with pytest.raises(NotFound):
        client.inspect_state(state_id)


def test_server_errors_become_the_same_subclass(client: WerkClient, server: WerkServer) -> None:
    made = client.prefill(
        PrefillRequest(
            model="kv",
            prompt="errors",
            policy=Policy(retention=Retention.DISK),
            allow_experimental=True,
        )
    )
    assert made.state is not None
    with pytest.raises(Unsupported) as tier:
        client.tier_state(made.state.id, TierRequest(target=Tier.RAM))
    _assert_error(tier.value, Unsupported, "runtime.state.tier.ram")
    assert tier.value.code is ErrorCode.UNSUPPORTED and not tier.value.retryable
    with pytest.raises(Unsupported) as experts:
        client.experts("kv")
    _assert_error(experts.value, Unsupported, "runtime.experts.residency")
    with pytest.raises(Unsupported) as action:
        client.expert_action("kv", "prefetch", ExpertActionRequest(experts=["e0"]))
    _assert_error(action.value, Unsupported, "runtime.experts.residency")
    with pytest.raises(NotFound) as job:
        client.job("job_0000000000")
    _assert_error(job.value, NotFound)
    with pytest.raises(NotFound) as model:
        client.capabilities(model="nope")
    _assert_error(model.value, NotFound)

    client.decode(DecodeRequest(handoff=made.handoff.token))
    with pytest.raises(InvalidHandoff) as reused:
        client.decode(DecodeRequest(handoff=made.handoff.token))
    _assert_error(reused.value, InvalidHandoff)
    with pytest.raises(ReuseUnavailable) as miss:
        client.prefill(
            PrefillRequest(
                model="kv",
                prompt="never seen",
                policy=Policy(reuse=Reuse.REQUIRED),
                allow_experimental=True,
            )
        )
    _assert_error(miss.value, ReuseUnavailable)
    assert miss.value.code is ErrorCode.REUSE_UNAVAILABLE  # not its 409 sibling
    assert not isinstance(miss.value, IncompatibleState)

    with (
        WerkClient(server.base_url, api_key=KEY + "x") as wrong,
        pytest.raises(Unauthenticated) as denied,
    ):
        wrong.info()
    _assert_error(denied.value, Unauthenticated)


def test_api_key_defaults_to_the_environment(
    server: WerkServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_API_KEY", KEY)
    with WerkClient(server.base_url) as from_env:
        assert from_env.info().server.auth.value == "api_key"
    monkeypatch.delenv("WERK_API_KEY")
    with WerkClient(server.base_url) as keyless, pytest.raises(Unauthenticated):
        keyless.info()


def test_response_bound_applies_to_a_real_server(server: WerkServer) -> None:
    with WerkClient(server.base_url, api_key=KEY, max_response_bytes=256) as tight:
        with pytest.raises(PayloadTooLarge):
            tight.capabilities()  # the matrix is a few KiB
        assert tight.set_residency("kv", resident=True, dry_run=True).model == "kv"


# -- construction refusals -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1:11434",
        "http://127.0.0.1:11434/werk",
        "http://127.0.0.1:11434/werk/v1",
        "ftp://127.0.0.1:11434",
        "http://:11434",
        "127.0.0.1:11434",
        "http://127.0.0.1:11434?next=/werk/v1",
        "http://127.0.0.1:11434#frag",
        "http://user:secret@127.0.0.1:11434",
    ],
)
def test_refuses_tls_and_non_root_urls(url: str) -> None:
    """Only ``http://host[:port][/]``: no TLS, no base path, query, fragment or credentials."""
    with pytest.raises(InvalidRequest):
        WerkClient(url)


def test_accepts_root_urls() -> None:
    for url in ("http://127.0.0.1:11434", "http://127.0.0.1:11434/", "http://localhost:1"):
        WerkClient(url).close()


# -- hostile fakes ---------------------------------------------------------------------------


@dataclass
class Fake:
    """A loopback HTTP server answering every request with ``behave(handler)``."""

    behave: Callable[[http.server.BaseHTTPRequestHandler], None]
    hits: list[str] = field(default_factory=list)
    url: str = ""


class _Handler(http.server.BaseHTTPRequestHandler):
    fake: Fake

    def _serve(self) -> None:
        self.fake.hits.append(f"{self.command} {self.path}")
        with contextlib.suppress(OSError):  # the client hung up (bounded read, timeout)
            self.fake.behave(self)

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def fake_server(behave: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[Fake]:
    fake = Fake(behave)
    handler = type("Handler", (_Handler,), {"fake": fake})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _reply(
    handler: http.server.BaseHTTPRequestHandler,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def test_never_follows_a_redirect() -> None:
    info = b'{"protocol": "1.0"}'
    with fake_server(lambda h: _reply(h, 200, info)) as target:
        for status in (301, 302, 307, 308):

            def redirect(h: http.server.BaseHTTPRequestHandler, status: int = status) -> None:
                _reply(h, status, b"", {"Location": f"{target.url}{h.path}"})

            with fake_server(redirect) as redirector, WerkClient(redirector.url) as c:
                with pytest.raises(InvalidRequest, match="redirect"):
                    c.info()
                with pytest.raises(InvalidRequest, match="redirect"):
                    c.prefill(PrefillRequest(model="kv", prompt="x"))
                assert redirector.hits == ["GET /werk/v1/info", "POST /werk/v1/prefill"]
        assert target.hits == []  # the redirect target was never contacted


def test_response_size_is_bounded() -> None:
    chunk = b" " * (1024 * 1024)

    def huge(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(20 * len(chunk)))
        h.end_headers()
        for _ in range(20):
            h.wfile.write(chunk)

    def chunked(h: http.server.BaseHTTPRequestHandler) -> None:  # no Content-Length at all
        h.protocol_version = "HTTP/1.1"
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()
        for _ in range(20):
            h.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        h.wfile.write(b"0\r\n\r\n")

    assert 20 * len(chunk) > MAX_RESPONSE_BYTES
    for behave in (huge, chunked):
        with fake_server(behave) as fake, WerkClient(fake.url) as c, pytest.raises(PayloadTooLarge):
            c.info()


def test_non_werk_answers_are_unavailable_not_trusted() -> None:
    for status, body in ((500, b"<html>oops</html>"), (200, b"not json"), (200, b'{"x": 1}')):
        behave = functools.partial(_reply, status=status, body=body)
        with fake_server(behave) as fake, WerkClient(fake.url) as c, pytest.raises(Unavailable):
            c.info()


def test_silent_server_is_a_timeout() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # connections complete in the backlog; nothing ever answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with WerkClient(url, timeout=0.5) as c, pytest.raises(WerkTimeout) as caught:
            c.info()
    assert caught.value.code is ErrorCode.TIMEOUT and caught.value.retryable


def test_nothing_listening_is_unavailable() -> None:
    with WerkClient(f"http://127.0.0.1:{free_port()}") as c, pytest.raises(Unavailable) as caught:
        c.info()
    assert caught.value.retryable


def test_identifiers_are_single_path_segments() -> None:
    with fake_server(lambda h: _reply(h, 404, b"")) as fake, WerkClient(fake.url) as c:
        for bad in ("../info", "a/b", "x?y=1", "%2e%2e", "", ".."):
            with pytest.raises(InvalidRequest):
                c.inspect_state(bad)
        assert fake.hits == []  # refused before any request
