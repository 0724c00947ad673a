"""Server-side Prefill defaults, end to end (seed "Server-side Prefill defaults").

Each server is a real ``werk serve`` started with different flags; ``/werk/v1/info`` shows the
defaults it runs with and prefill outcomes show them applied:

* absent top-level ``policy`` / ``allow_experimental`` take the server's defaults (or the
  protocol defaults ``ephemeral``/``disabled``/no TTL/no pin and no opt-in without any);
* a present ``policy`` object is the complete policy (its absent members are protocol defaults,
  never the server's), and a present ``allow_experimental: false`` is never promoted;
* ``--persistence`` alone means auto / prefer / no TTL / no pin / opt-in; any granular flag
  implies it; TTLs outside 1..2592000 stop the server at startup and are ``400`` per request.
"""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from _server import WERK, WerkServer, free_port, server_env

from werk.protocol import (
    ErrorBody,
    InfoResponse,
    PrefillResponse,
    ReuseOutcome,
    StateSummary,
    Tier,
    to_builtins,
)

P = "/werk/v1"
SpawnServer = Callable[..., WerkServer]

PROTOCOL_DEFAULT_AUTO = {
    "retention": "auto",
    "reuse": "prefer",
    "ttl_seconds": None,
    "pin": False,
    "allow_experimental": True,
}


@pytest.fixture(scope="module")
def plain(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server()


@pytest.fixture(scope="module")
def persist(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(args=["--persistence"])


@pytest.fixture(scope="module")
def granular(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(
        args=[
            "--persistence-mode",
            "disk",
            "--persistence-reuse",
            "required",
            "--persistence-ttl-seconds",
            "60",
            "--persistence-pin",
        ]
    )


@pytest.fixture(scope="module")
def longest_ttl_pin(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(args=["--persistence-ttl-seconds", "2592000", "--persistence-pin"])


@pytest.fixture(scope="module")
def shortest_ttl(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(args=["--persistence-ttl-seconds", "1"])


def prefill(server: WerkServer, prompt: str, **members: Any) -> httpx.Response:
    with server.client() as http:
        return http.post(f"{P}/prefill", json={"model": "kv", "prompt": prompt, **members})


def ok(response: httpx.Response) -> PrefillResponse:
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=PrefillResponse)


def refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert msgspec.json.decode(response.content, type=ErrorBody).error.code == code


def lifetime(state: StateSummary) -> Any:
    """``expires_at - created_at`` in seconds (``None`` without a TTL).

    Both are millisecond-truncated renderings of ``created + ttl``, so the difference may be off
    by one millisecond; it is returned as ``pytest.approx`` of itself for exact comparisons.
    """
    if state.expires_at is None:
        return None
    expires = dt.datetime.fromisoformat(state.expires_at)
    seconds = (expires - dt.datetime.fromisoformat(state.created_at)).total_seconds()
    return pytest.approx(seconds, abs=0.0011)


def info_defaults(server: WerkServer) -> dict[str, Any] | None:
    with server.client() as http:
        response = http.get(f"{P}/info")
    info = msgspec.json.decode(response.content, type=InfoResponse)
    defaults: dict[str, Any] | None = to_builtins(info.persistence_defaults)
    return defaults


# -- what /info shows ------------------------------------------------------------------------


def test_info_shows_the_defaults_each_server_runs_with(
    plain: WerkServer,
    persist: WerkServer,
    granular: WerkServer,
    longest_ttl_pin: WerkServer,
    shortest_ttl: WerkServer,
) -> None:
    assert info_defaults(plain) is None
    assert info_defaults(persist) == PROTOCOL_DEFAULT_AUTO
    assert info_defaults(granular) == {
        "retention": "disk",
        "reuse": "required",
        "ttl_seconds": 60,
        "pin": True,
        "allow_experimental": True,
    }
    # Any one granular flag implies --persistence; the others keep the --persistence meaning.
    assert info_defaults(longest_ttl_pin) == {
        **PROTOCOL_DEFAULT_AUTO,
        "ttl_seconds": 2_592_000,
        "pin": True,
    }
    assert info_defaults(shortest_ttl) == {**PROTOCOL_DEFAULT_AUTO, "ttl_seconds": 1}


# -- a server without defaults ---------------------------------------------------------------


def test_without_defaults_absent_members_take_the_protocol_defaults(plain: WerkServer) -> None:
    bare = ok(prefill(plain, "plain absent policy", allow_experimental=True))
    assert bare.state is None and bare.reuse.outcome is ReuseOutcome.DISABLED  # ephemeral
    refused(prefill(plain, "plain absent opt-in"), 403, "experimental_opt_in_required")
    refused(
        prefill(plain, "plain explicit false", allow_experimental=False),
        403,
        "experimental_opt_in_required",
    )
    disk = ok(prefill(plain, "plain disk", policy={"retention": "disk"}, allow_experimental=True))
    assert disk.state is not None and disk.state.tier is Tier.DISK
    assert disk.reuse.outcome is ReuseOutcome.DISABLED  # the present policy's absent reuse
    assert not disk.state.pinned and disk.state.expires_at is None


def test_per_request_ttl_bounds(plain: WerkServer) -> None:
    for ttl in (0, 2_592_001, -5):
        response = prefill(
            plain,
            f"ttl {ttl}",
            policy={"retention": "disk", "ttl_seconds": ttl},
            allow_experimental=True,
        )
        refused(response, 400, "invalid_request")
        assert "ttl_seconds" in response.text
    for ttl in (1, 2_592_000):
        made = ok(
            prefill(
                plain,
                f"ttl {ttl}",
                policy={"retention": "disk", "ttl_seconds": ttl},
                allow_experimental=True,
            )
        )
        assert made.state is not None and lifetime(made.state) == ttl
    unbounded = ok(
        prefill(
            plain,
            "ttl null",
            policy={"retention": "disk", "ttl_seconds": None},
            allow_experimental=True,
        )
    )
    assert unbounded.state is not None and lifetime(unbounded.state) is None


# -- --persistence ---------------------------------------------------------------------------


def test_persistence_fills_absent_members_only(persist: WerkServer) -> None:
    first = ok(prefill(persist, "persist absent"))  # no policy, no allow_experimental
    assert first.state is not None and first.state.tier is Tier.DISK  # auto + the opt-in
    assert first.reuse.outcome is ReuseOutcome.FRESH  # prefer
    assert not first.state.pinned and first.state.expires_at is None
    second = ok(prefill(persist, "persist absent"))
    assert second.reuse.outcome is ReuseOutcome.REUSED
    assert second.reuse.state_id == first.state.id
    assert second.usage.cached_tokens == second.usage.prompt_tokens

    refused(
        prefill(persist, "persist absent", allow_experimental=False),
        403,
        "experimental_opt_in_required",
    )  # explicit false is never promoted
    empty = ok(prefill(persist, "persist absent", policy={}))
    assert empty.state is None and empty.reuse.outcome is ReuseOutcome.DISABLED
    disk = ok(prefill(persist, "persist present disk", policy={"retention": "disk"}))
    assert disk.state is not None and disk.state.tier is Tier.DISK
    assert disk.reuse.outcome is ReuseOutcome.DISABLED  # not the server's "prefer"


# -- granular flags --------------------------------------------------------------------------


def test_granular_defaults_apply_to_absent_policy(granular: WerkServer) -> None:
    refused(prefill(granular, "granular new"), 409, "reuse_unavailable")  # reuse: required
    own = ok(prefill(granular, "granular new", policy={"retention": "disk", "reuse": "prefer"}))
    assert own.state is not None and own.reuse.outcome is ReuseOutcome.FRESH
    # The present policy owned pin and TTL: the server's pin and 60 s did not leak in.
    assert not own.state.pinned and own.state.expires_at is None
    reused = ok(prefill(granular, "granular new"))
    assert reused.reuse.outcome is ReuseOutcome.REUSED and reused.reuse.state_id == own.state.id
    refused(
        prefill(granular, "granular new", allow_experimental=False),
        403,
        "experimental_opt_in_required",
    )


def test_granular_ttl_and_pin_show_in_new_states(longest_ttl_pin: WerkServer) -> None:
    made = ok(prefill(longest_ttl_pin, "pinned for thirty days"))
    assert made.state is not None and made.state.tier is Tier.DISK
    assert made.state.pinned and lifetime(made.state) == 2_592_000
    present = ok(prefill(longest_ttl_pin, "a present policy", policy={"retention": "disk"}))
    assert present.state is not None
    assert not present.state.pinned and lifetime(present.state) is None


def test_shortest_default_ttl_applies(shortest_ttl: WerkServer) -> None:
    made = ok(prefill(shortest_ttl, "one second"))
    assert made.state is not None and lifetime(made.state) == 1


# -- startup validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--persistence-ttl-seconds", "0", "must be between 1 and 2592000"),
        ("--persistence-ttl-seconds", "2592001", "must be between 1 and 2592000"),
        ("--persistence-ttl-seconds", "soon", "--persistence-ttl-seconds"),
        ("--persistence-mode", "forever", "--persistence-mode"),
        ("--persistence-reuse", "sometimes", "--persistence-reuse"),
    ],
)
def test_invalid_defaults_stop_the_server_at_startup(
    tmp_path: Path, flag: str, value: str, message: str
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        [str(WERK), "serve", "--port", str(free_port()), flag, value],
        env=server_env(home, None),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert message in result.stderr and flag in result.stderr, result.stderr
    assert "serving on" not in result.stderr + result.stdout
