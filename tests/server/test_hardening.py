"""Hardening of a real ``werk serve`` on loopback: authentication on every route, slow-header
clients, non-loopback binds, and DNS-rebinding ``Host`` headers.

The bad-body battery is in ``test_hardening_bodies.py``; the fuzzing in ``test_schemathesis.py``.
"""

from __future__ import annotations

import inspect
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import h11
import httpx
import pytest
from _server import (
    OPENAI_ROUTES,
    WERK,
    ErrorBodyCheck,
    WerkServer,
    free_port,
    import_model,
    server_env,
    werk_serve,
)

from werk.cli.serve import serve
from werk.http.routes import ROUTE_SPECS
from werk.http.server import HEADER_TIMEOUT_SECONDS

KEY = "hardening-key-0123456789abcdef"
HEADER_TIMEOUT = 2.0  # seconds; `werk serve --header-timeout` (default 10 s)

PUBLIC_ROUTES = frozenset({("GET", "/werk/v1/health")})
"""The deliberate exceptions to "every route needs a key": the liveness probe only."""

ALL_ROUTES = (
    *((s.method, s.path) for s in ROUTE_SPECS),
    ("GET", "/werk/v1/openapi.json"),
    *OPENAI_ROUTES,
)

BAD_CREDENTIALS: dict[str, dict[str, str]] = {
    "none": {},
    "wrong key": {"Authorization": "Bearer not-the-key"},
    "key prefix": {"Authorization": f"Bearer {KEY[:-1]}"},
    "key with suffix": {"Authorization": f"Bearer {KEY}x"},
    "basic scheme": {"Authorization": f"Basic {KEY}"},
    "bare key": {"Authorization": KEY},
    "bearer without key": {"Authorization": "Bearer"},
}


def _home(factory: pytest.TempPathFactory, name: str) -> Path:
    home = factory.mktemp(name) / "home"
    home.mkdir()
    return home


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, testkv_site: Path) -> Iterator[WerkServer]:
    """API-key mode, testkv model ``kv``, a 2 s header deadline."""
    home = _home(tmp_path_factory, "keyed")
    import_model(home, testkv_site, "kv")
    args = ["--model", "kv", "--api-key", KEY, "--header-timeout", str(HEADER_TIMEOUT)]
    with werk_serve(home, testkv_site, args) as server:
        yield server


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, testkv_site: Path) -> Iterator[WerkServer]:
    """Unauthenticated local mode, testkv model ``kv``."""
    home = _home(tmp_path_factory, "local")
    import_model(home, testkv_site, "kv")
    with werk_serve(home, testkv_site, ["--model", "kv"]) as server:
        yield server


def _concrete(path: str) -> str:
    return (
        path.replace("{model}", "kv")
        .replace("{state_id}", "st_0123456789abcdef")
        .replace("{job_id}", "job_0123456789abcdef")
    )


def _call(http: httpx.Client, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    if method == "POST":
        return http.post(_concrete(path), json={}, headers=headers)
    return http.get(_concrete(path), headers=headers)


# -- authentication ------------------------------------------------------------------------------


def test_route_table_walk_every_route_needs_a_key(
    keyed: WerkServer, error_body: ErrorBodyCheck
) -> None:
    """Every served route answers 401 + ``WWW-Authenticate: Bearer`` + the JSON error body to
    each kind of missing or wrong credential; the only exceptions are :data:`PUBLIC_ROUTES`."""
    answered_without_key: set[tuple[str, str]] = set()
    with keyed.client() as http:
        for method, path in ALL_ROUTES:
            for name, headers in BAD_CREDENTIALS.items():
                response = _call(http, method, path, headers)
                if response.status_code != 401:
                    answered_without_key.add((method, path))
                    continue
                error = error_body.response(keyed, response, 401)
                assert error["code"] == "unauthenticated", (method, path, name)
                assert response.headers["www-authenticate"] == "Bearer", (method, path, name)
            # The same request with the key is not refused: the 401s above came from the key.
            admitted = _call(http, method, path, {"Authorization": f"Bearer {KEY}"})
            assert admitted.status_code != 401, (method, path, admitted.text)
    assert answered_without_key == PUBLIC_ROUTES
    assert {(s.method, s.path) for s in ROUTE_SPECS if not s.authenticated} == PUBLIC_ROUTES


def test_walk_covers_the_published_document(keyed: WerkServer) -> None:
    """The walk is not a hand-picked list: it covers every operation the server publishes."""
    with keyed.client(KEY) as http:
        document = http.get("/werk/v1/openapi.json").json()
    published = {
        (method.upper(), path) for path, ops in document["paths"].items() for method in ops
    }
    # Every route but the document itself is published (the /v1 routes too).
    assert published == set(ALL_ROUTES) - {("GET", "/werk/v1/openapi.json")}


def test_public_health_probe_reveals_nothing(keyed: WerkServer) -> None:
    with keyed.client() as http:
        response = http.get("/werk/v1/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["x-werk-request-id"].startswith("req_")


# -- slow-header clients -------------------------------------------------------------------------


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset); any data read is discarded."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def _trickle(sock: socket.socket, byte: bytes) -> bool:
    """Send one byte; ``False`` when the server has already closed the connection."""
    if _closed_by_peer(sock):
        return False
    try:
        sock.send(byte)
    except (ConnectionResetError, BrokenPipeError):
        return False
    return True


def test_slow_header_clients_are_closed_while_a_normal_client_is_served(
    keyed: WerkServer,
) -> None:
    """Clients that trickle their headers one byte a second (or send nothing at all) are cut
    off at the header deadline; a normal client keeps getting answers meanwhile."""
    port = int(keyed.base_url.rsplit(":", 1)[1])
    trickling = [socket.create_connection(("127.0.0.1", port)) for _ in range(6)]
    silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    for sock in trickling:
        sock.sendall(b"GET /werk/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    tail = b"X-Slow: " + b"a" * 60  # never finished: no CRLF CRLF follows
    alive = set(trickling + silent)
    served = 0
    started = time.monotonic()
    try:
        with keyed.client(KEY) as http:
            for index in range(len(tail)):
                for sock in list(alive):
                    byte = tail[index : index + 1]
                    still = _trickle(sock, byte) if sock in trickling else not _closed_by_peer(sock)
                    if not still:
                        alive.discard(sock)
                response = http.get("/werk/v1/info")
                assert response.status_code == 200
                served += 1
                if not alive:
                    break
                time.sleep(1.0)
        elapsed = time.monotonic() - started
        print(
            f"\n8 slow clients closed after {elapsed:.1f} s (deadline {HEADER_TIMEOUT} s); "
            f"{served} normal requests served meanwhile"
        )
        assert not alive, f"{len(alive)} slow clients still open after {len(tail)} header bytes"
        assert served >= 1
    finally:
        for sock in trickling + silent:
            sock.close()


def _request(conn: h11.Connection, sock: socket.socket, target: bytes) -> int:
    """Send a complete GET with ``h11`` and read its response; returns the status."""
    headers = [(b"Host", b"127.0.0.1"), (b"Authorization", f"Bearer {KEY}".encode())]
    sock.sendall(conn.send(h11.Request(method=b"GET", target=target, headers=headers)))
    sock.sendall(conn.send(h11.EndOfMessage()))
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            return status
        elif isinstance(event, h11.ConnectionClosed):
            raise AssertionError("closed before the response ended")


def test_slow_headers_on_a_kept_alive_connection_are_closed(keyed: WerkServer) -> None:
    """After one complete exchange, a client that trickles its next request's headers is
    closed too (uvicorn's keep-alive timer alone is reset by every byte and never fires)."""
    port = int(keyed.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        conn = h11.Connection(h11.CLIENT)
        assert _request(conn, sock, b"/werk/v1/info") == 200
        conn.start_next_cycle()
        assert _request(conn, sock, b"/werk/v1/health") == 200
        trickle = b"GET /werk/v1/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60
        started = time.monotonic()
        sent = 0
        for index in range(len(trickle)):
            if not _trickle(sock, trickle[index : index + 1]):
                break
            sent += 1
            time.sleep(1.0)
        print(
            f"\nkept-alive slow client closed after {sent} bytes, "
            f"{time.monotonic() - started:.1f} s (deadline {HEADER_TIMEOUT} s)"
        )
        assert sent < len(trickle), "the server let the whole trickled header through"


def test_header_deadline_option_defaults_and_bounds(tmp_path: Path) -> None:
    """``--header-timeout`` defaults to the server's deadline and refuses values outside
    1..600 s at startup (exit 2, naming the option) without serving anything."""
    default = inspect.signature(serve).parameters["header_timeout"].default.default
    assert default == HEADER_TIMEOUT_SECONDS == 10.0
    env = server_env(tmp_path, None)
    for value in ("0.5", "601", "nan", "-1"):
        result = subprocess.run(
            [str(WERK), "serve", "--port", str(free_port()), "--header-timeout", value],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (value, result.stderr)
        assert "--header-timeout" in result.stderr
        assert "serving on" not in result.stderr


def test_keep_alive_option_refuses_what_is_not_a_duration(tmp_path: Path) -> None:
    """``--keep-alive`` takes Ollama's forms; anything else is a usage error (exit 2, naming
    the option) before anything is served."""
    env = server_env(tmp_path, None)
    for value in ("soon", "5x", "1h 2m", "31d", "nan"):
        result = subprocess.run(
            [str(WERK), "serve", "--port", str(free_port()), "--keep-alive", value],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2, (value, result.stderr)
        assert "--keep-alive" in result.stderr and "serving on" not in result.stderr


def test_a_bad_model_cache_release_setting_is_refused_before_serving(tmp_path: Path) -> None:
    env = {**server_env(tmp_path, None), "WERK_MODEL_CACHE_RELEASE": "sometimes"}
    result = subprocess.run(
        [str(WERK), "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "WERK_MODEL_CACHE_RELEASE must be auto, on or off, not 'sometimes'" in result.stderr
    assert "serving on" not in result.stderr


# -- binding -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "extra", "env"),
    [
        ("0.0.0.0", [], {}),
        ("::", [], {}),
        ("192.0.2.10", [], {}),
        ("0.0.0.0", ["--api-key", "  "], {}),
        ("0.0.0.0", [], {"WERK_API_KEYS": " , "}),
    ],
    ids=["0.0.0.0", "::", "192.0.2.10", "blank --api-key", "blank WERK_API_KEYS"],
)
def test_non_loopback_bind_without_a_key_is_refused(
    tmp_path: Path, host: str, extra: list[str], env: dict[str, str]
) -> None:
    """Exit code 2 and a message that names the address and the ways out; the refusal comes
    before the server is built, so nothing is bound and no ``serving on`` line is printed."""
    result = subprocess.run(
        [str(WERK), "serve", "--host", host, "--port", str(free_port()), *extra],
        env=server_env(tmp_path, None, env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert f"refusing to bind {host} without an API key" in result.stderr
    assert "--insecure-no-auth" in result.stderr
    assert "serving on" not in result.stderr


def test_insecure_no_auth_binds_all_interfaces_loudly(tmp_path: Path, testkv_site: Path) -> None:
    """``--insecure-no-auth`` overrides the refusal, with a warning; the server is reached over
    127.0.0.1 only and stopped at once."""
    home = tmp_path / "home"
    home.mkdir()
    with werk_serve(home, testkv_site, ["--host", "0.0.0.0", "--insecure-no-auth"]) as server:
        with server.client() as http:
            info = http.get("/werk/v1/info")
            # Meant to be reached by other names: the loopback-Host rule is off in this mode.
            lan_named = http.get("/werk/v1/info", headers={"Host": "werk-box.lan:11434"})
        log = server.log()
        server.stop()
    assert info.status_code == 200
    assert lan_named.status_code == 200, lan_named.text
    assert info.json()["server"]["auth"] == "unauthenticated_local"
    assert "WARNING: serving 0.0.0.0 WITHOUT AUTHENTICATION (--insecure-no-auth)" in log
    assert "serving on http://0.0.0.0:" in log


# -- DNS rebinding -------------------------------------------------------------------------------

REBINDING_HOSTS = (
    "evil.example",
    "127.0.0.1.evil.example",
    "attacker.com:11434",
    "localhost.evil.example",
    "0.0.0.0",
)
HOST_CHECKED = (
    ("GET", "/werk/v1/info"),
    ("GET", "/werk/v1/states"),
    ("POST", "/werk/v1/prefill"),
    ("GET", "/werk/v1/openapi.json"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
)


def test_rebinding_host_is_refused_in_unauthenticated_mode(
    local: WerkServer, error_body: ErrorBodyCheck
) -> None:
    with local.client() as http:
        for host in REBINDING_HOSTS:
            for method, path in HOST_CHECKED:
                response = _call(http, method, path, {"Host": host})
                error = error_body.response(local, response, 400)
                assert error["code"] == "invalid_request", (host, path)
                assert "Host" in str(error["message"])


def test_loopback_hosts_are_accepted_in_unauthenticated_mode(local: WerkServer) -> None:
    port = local.base_url.rsplit(":", 1)[1]
    hosts = ("localhost", f"localhost:{port}", "127.0.0.1", f"127.0.0.1:{port}", f"[::1]:{port}")
    with local.client() as http:
        for host in hosts:
            response = http.get("/werk/v1/info", headers={"Host": host})
            assert response.status_code == 200, (host, response.text)


def test_any_host_with_a_valid_key_is_accepted_in_api_key_mode(
    keyed: WerkServer, error_body: ErrorBodyCheck
) -> None:
    with keyed.client() as http:
        for host in REBINDING_HOSTS:
            ok = http.get("/werk/v1/info", headers={"Host": host, "Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200, (host, ok.text)
            refused = http.get("/werk/v1/info", headers={"Host": host})
            assert error_body.response(keyed, refused, 401)["code"] == "unauthenticated"
