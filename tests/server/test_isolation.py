"""Principal isolation over HTTP: two API keys, identical prompts, one real ``werk serve``.

Key A prefills and persists; key B, sending the identical prompt, can neither list, inspect,
reuse, prune, pin, move nor decode A's state or handoff. B's refusals are the ones it would get
for something that does not exist at all (``404`` / ``410`` with the same message, ``fresh`` /
``reuse_unavailable`` for reuse), never a ``403`` or an ``incompatible_state`` that would reveal
A's state. A still sees everything unchanged afterwards. On disk each key has its own
``p_<hmac>`` directory, no raw key is stored anywhere under ``WERK_HOME``, and the store is
owner-only.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from _server import WerkServer

from werk.protocol import (
    DecodeResponse,
    ErrorBody,
    ErrorDetail,
    PinResult,
    PrefillResponse,
    PruneResult,
    ReuseOutcome,
    StateList,
    StateSummary,
    StatsResponse,
)

KEY_A = "isolation-key-alice-7f3a9c"
KEY_B = "isolation-key-bob-2e8d41"
PROMPT = "the very same prompt, sent by two different keys"
DISK_PREFER = {"retention": "disk", "reuse": "prefer"}
P = "/werk/v1"
PRINCIPAL_DIR = re.compile(r"^p_[0-9a-f]{64}$")


@dataclass
class World:
    server: WerkServer
    alice: httpx.Client
    bob: httpx.Client
    made: PrefillResponse
    state: StateSummary


def _error(response: httpx.Response, status: int, code: str) -> ErrorDetail:
    assert response.status_code == status, response.text
    detail = msgspec.json.decode(response.content, type=ErrorBody).error
    assert detail.code == code, detail
    return detail


def _ok(response: httpx.Response, type: type[Any]) -> Any:
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=type)


def _prefill(http: httpx.Client, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": "kv", "prompt": PROMPT, "allow_experimental": True}
    body.update(extra)
    return http.post(f"{P}/prefill", json=body)


@pytest.fixture(scope="module")
def world(spawn_server: Callable[..., WerkServer]) -> Iterator[World]:
    server = spawn_server(keys=[KEY_A, KEY_B])
    with server.client(KEY_A) as alice, server.client(KEY_B) as bob:
        made = _ok(_prefill(alice, policy=DISK_PREFER), PrefillResponse)
        assert made.state is not None
        yield World(server, alice, bob, made, made.state)


def test_b_cannot_list_or_inspect(world: World) -> None:
    assert _ok(world.bob.get(f"{P}/states"), StateList).states == []
    for params in ({"model": "kv"}, {"tier": "disk"}, {"pinned": "false"}):
        assert _ok(world.bob.get(f"{P}/states", params=params), StateList).states == []
    theirs = _error(world.bob.get(f"{P}/states/{world.state.id}"), 404, "not_found")
    nobody = _error(world.bob.get(f"{P}/states/st_{secrets.token_urlsafe(18)}"), 404, "not_found")
    assert theirs.message == nobody.message  # indistinguishable from a state that never existed


def test_stats_count_only_the_callers_own_prefills(spawn_server: Callable[..., WerkServer]) -> None:
    """``GET /werk/v1/stats`` counts the caller's own prefills only."""
    server = spawn_server(keys=[KEY_A, KEY_B])
    with server.client(KEY_A) as alice, server.client(KEY_B) as bob:
        made = _ok(_prefill(alice, policy=DISK_PREFER), PrefillResponse)
        again = _ok(_prefill(alice, policy=DISK_PREFER), PrefillResponse)
        assert again.reuse.outcome is ReuseOutcome.REUSED
        mine = _ok(alice.get(f"{P}/stats"), StatsResponse)
        [kv] = mine.models
        assert kv.model == "kv" and kv.prefills == 2
        assert kv.prompt_tokens == made.usage.prompt_tokens + again.usage.prompt_tokens
        assert kv.cached_tokens == (made.usage.cached_tokens or 0) + (
            again.usage.cached_tokens or 0
        )
        assert kv.cached_tokens > 0  # the second prefill reused the first one's state
        assert _ok(bob.get(f"{P}/stats"), StatsResponse).models == []


def test_b_cannot_reuse_and_is_not_told_a_state_exists(world: World) -> None:
    required = _prefill(world.bob, policy={"retention": "disk", "reuse": "required"})
    _error(required, 409, "reuse_unavailable")  # a miss, never incompatible_state
    fresh = _ok(_prefill(world.bob, policy=DISK_PREFER), PrefillResponse)
    assert fresh.reuse.outcome is ReuseOutcome.FRESH and fresh.reuse.state_id is None
    assert fresh.usage.cached_tokens == 0
    assert fresh.state is not None and fresh.state.id != world.state.id
    again = _ok(_prefill(world.bob, policy=DISK_PREFER), PrefillResponse)
    assert again.reuse.state_id == fresh.state.id  # B reuses only its own state
    for token in (fresh.handoff.token, again.handoff.token):
        _ok(world.bob.post(f"{P}/decode", json={"handoff": token}), DecodeResponse)


def test_b_cannot_pin_or_move(world: World) -> None:
    for dry_run in (True, False):
        pin = world.bob.post(
            f"{P}/states/{world.state.id}/pin", json={"pinned": True, "dry_run": dry_run}
        )
        _error(pin, 404, "not_found")
        tier = world.bob.post(
            f"{P}/states/{world.state.id}/tier", json={"target": "ram", "dry_run": dry_run}
        )
        _error(tier, 404, "not_found")  # not 501: the refusal does not reveal the state


def test_b_cannot_prune(world: World) -> None:
    for dry_run in (True, False):
        by_id = _ok(
            world.bob.post(f"{P}/states/prune", json={"ids": [world.state.id], "dry_run": dry_run}),
            PruneResult,
        )
        assert (by_id.selected, by_id.deleted, by_id.skipped) == ([], [], [])
    everything = _ok(
        world.bob.post(f"{P}/states/prune", json={"all": True, "confirm": "all", "dry_run": False}),
        PruneResult,
    )
    assert world.state.id not in everything.selected + everything.deleted
    by_filter = _ok(
        world.bob.post(f"{P}/states/prune", json={"filter": {"model": "kv"}, "dry_run": False}),
        PruneResult,
    )
    assert world.state.id not in by_filter.selected + by_filter.deleted


def test_b_cannot_decode_a_handoff_and_does_not_burn_it(world: World) -> None:
    made = _ok(_prefill(world.alice), PrefillResponse)  # ephemeral: a handoff only
    stolen = _error(
        world.bob.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff"
    )
    bogus = _error(
        world.bob.post(f"{P}/decode", json={"handoff": "wh_" + secrets.token_urlsafe(32)}),
        410,
        "invalid_handoff",
    )
    assert stolen.message == bogus.message
    mine = _ok(
        world.alice.post(f"{P}/decode", json={"handoff": made.handoff.token}), DecodeResponse
    )
    assert mine.text


def test_a_still_sees_everything(world: World) -> None:
    """Runs after B's attempts (file order): A's state is intact, unpinned, reusable."""
    listed = _ok(world.alice.get(f"{P}/states"), StateList).states
    assert [s.id for s in listed] == [world.state.id]
    inspected = _ok(world.alice.get(f"{P}/states/{world.state.id}"), StateSummary)
    assert not inspected.pinned and inspected.reusable
    reused = _ok(_prefill(world.alice, policy=DISK_PREFER), PrefillResponse)
    assert reused.reuse.outcome is ReuseOutcome.REUSED
    assert reused.reuse.state_id == world.state.id
    assert reused.usage.cached_tokens == len(PROMPT.encode())
    decoded = _ok(
        world.alice.post(f"{P}/decode", json={"handoff": world.made.handoff.token}),
        DecodeResponse,
    )
    assert decoded.text
    preview = _ok(
        world.alice.post(f"{P}/states/{world.state.id}/pin", json={"pinned": True}), PinResult
    )
    assert preview.state.id == world.state.id


def test_on_disk_layout_is_per_principal_private_and_key_free(world: World) -> None:
    own = _ok(_prefill(world.bob, policy={"retention": "disk"}), PrefillResponse)
    assert own.state is not None
    home = world.server.home
    store = home / "runtime-state" / "v1"
    principals = sorted(p.name for p in store.iterdir() if p.name.startswith("p_"))
    assert len(principals) == 2 and all(PRINCIPAL_DIR.fullmatch(p) for p in principals)
    owners = {p: {s.name for s in (store / p).iterdir()} for p in principals}
    alice_dir = next(p for p, states in owners.items() if world.state.id in states)
    bob_dir = next(p for p in principals if p != alice_dir)
    assert world.state.id not in owners[bob_dir] and own.state.id in owners[bob_dir]
    meta = [
        json.loads((store / d / s / "metadata.json").read_bytes())
        for d, s in ((alice_dir, world.state.id), (bob_dir, own.state.id))
    ]
    assert [m["principal"] for m in meta] == [alice_dir, bob_dir]
    # Prompt fingerprints are keyed per principal: the identical prompt does not match.
    assert meta[0]["fingerprint"] != meta[1]["fingerprint"]

    secrets_found: list[str] = []
    for path in _walk(home):
        mode = path.lstat().st_mode
        assert not stat.S_ISLNK(mode), path
        if stat.S_ISDIR(mode):
            assert stat.S_IMODE(mode) == 0o700, (path, oct(mode))
        else:
            assert stat.S_IMODE(mode) == 0o600, (path, oct(mode))
            data = path.read_bytes()
            secrets_found += [f"{path}: {k}" for k in (KEY_A, KEY_B) if k.encode() in data]
        secrets_found += [f"{path}: name" for k in (KEY_A, KEY_B) if k in path.name]
    assert secrets_found == []
    log = world.server.log()
    assert KEY_A not in log and KEY_B not in log


def _walk(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(directory) / name
