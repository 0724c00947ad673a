"""A growing conversation continues from its last saved state, across a restart, end to end:
real ``werk serve``, its managed llama-server, the demo model.

Turn 1 is prefilled to disk; the server is restarted (a new process generation); turn 1 + turn
2 with ``reuse: prefer`` continues turn 1's state: the response names it (``match: prefix``),
the tokens restored are turn 1's prompt, the tokens evaluated are the rest only — checked
against llama-server's own log line for that task — and the greedy continuation equals a cold
prefill + decode of the same messages. Another API key sending the same conversation continues
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_llamacpp_states_e2e as e2e
from test_llamacpp_states_support import needs_llama_server

from werk.testing.server import WerkServer, werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]

KEY_A, KEY_B = "prefix-key-alpha-0123456789", "prefix-key-bravo-0123456789"
PREFIX_ROW = "runtime.state.restore.prefix"
SYSTEM = {"role": "system", "content": "You keep the workshop's clocks. " * 8}
TURN_1 = [SYSTEM, {"role": "user", "content": "Which clock is the oldest one here?"}]


def _prefill(client: httpx.Client, messages: list[dict[str, str]], **policy: str) -> Any:
    body = {
        "model": "demo",
        "messages": messages,
        "allow_experimental": True,
        "policy": {"retention": "disk", **policy},
    }
    answer = client.post("/werk/v1/prefill", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _decode(client: httpx.Client, token: str) -> str:
    answer = client.post(
        "/werk/v1/decode", json={"handoff": token, "max_tokens": 12, "temperature": 0}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["text"])


def _row(client: httpx.Client) -> dict[str, Any]:
    rows = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()["capabilities"]
    [row] = [r for r in rows if r["id"] == PREFIX_ROW]
    return dict(row)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    e2e._create_demo(made, e2e._env())
    return made


def _serve(home: Path) -> Any:
    args = ["--model", "demo", "--api-key", KEY_A, "--api-key", KEY_B]
    return werk_serve(home, None, args, env=e2e._env(), startup_timeout=60)


@pytest.fixture
def conversation(home: Path) -> Iterator[tuple[WerkServer, dict[str, Any], str]]:
    """Turn 1 saved to disk by key A in a first server; yields a restarted server, turn 1's
    prefill answer and its greedy reply."""
    with _serve(home) as first, first.client(KEY_A) as alice:
        turn_1 = _prefill(alice, TURN_1, reuse="prefer")
        assert turn_1["reuse"]["outcome"] == "fresh"
        reply = _decode(alice, turn_1["handoff"]["token"])
        row = _row(alice)
        assert row["status"] == "experimental", row  # this generation's probe proved it
        assert "reproduced a cold run" in row["reason"]
    with _serve(home) as second:
        yield second, turn_1, reply


def test_turn_two_continues_turn_one_after_a_restart(
    conversation: tuple[WerkServer, dict[str, Any], str],
) -> None:
    server, turn_1, reply = conversation
    turn_2 = [*TURN_1, {"role": "assistant", "content": reply}]
    turn_2.append({"role": "user", "content": "And who winds it every morning?"})
    with server.client(KEY_A) as alice:
        continued = _prefill(alice, turn_2, reuse="prefer")
        reuse, usage = continued["reuse"], continued["usage"]
        restored = turn_1["usage"]["prompt_tokens"]
        assert reuse["outcome"] == "reused" and reuse["match"] == "prefix", reuse
        assert reuse["state_id"] == turn_1["state"]["id"]
        assert reuse["restored_tokens"] == restored
        assert usage["cached_tokens"] == restored, usage
        assert usage["evaluated_tokens"] == usage["prompt_tokens"] - restored > 0
        # llama-server's own count for that task: only the suffix was computed
        child = e2e.ManagedChild(server)
        evals = child.prompt_evals(child.state_slot())
        assert evals[-1] == usage["evaluated_tokens"], evals
        assert continued["state"]["id"] != turn_1["state"]["id"]  # turn 2 kept as its own state
        text = _decode(alice, continued["handoff"]["token"])
        cold = _prefill(alice, turn_2, reuse="disabled")
        assert cold["reuse"]["outcome"] == "disabled" and cold["usage"]["cached_tokens"] == 0
        assert _decode(alice, cold["handoff"]["token"]) == text
        again = _prefill(alice, turn_2, reuse="required")  # now an exact state exists
        assert again["reuse"]["match"] == "exact"
        assert _row(alice)["status"] == "experimental"


def test_another_key_continues_nothing(
    conversation: tuple[WerkServer, dict[str, Any], str],
) -> None:
    server, _, reply = conversation
    turn_2 = [*TURN_1, {"role": "assistant", "content": reply}]
    turn_2.append({"role": "user", "content": "And who winds it every morning?"})
    with server.client(KEY_B) as bob:
        refused = bob.post(
            "/werk/v1/prefill",
            json={
                "model": "demo",
                "messages": turn_2,
                "allow_experimental": True,
                "policy": {"retention": "ephemeral", "reuse": "required"},
            },
            timeout=300,
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "reuse_unavailable"
        theirs = _prefill(bob, turn_2, reuse="prefer")
        assert theirs["reuse"] == {
            "outcome": "fresh",
            "state_id": None,
            "match": None,
            "restored_tokens": None,
        }
        assert theirs["usage"]["cached_tokens"] == 0
