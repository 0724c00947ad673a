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

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_llamacpp_states_e2e as e2e
from test_llamacpp_states_support import needs_llama_server

from werk.testing.server import WERK, WerkServer, server_env, werk_serve

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


def _turn_2(reply: str) -> list[dict[str, str]]:
    """Turn 1, its reply, and the next question."""
    return [
        *TURN_1,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And who winds it every morning?"},
    ]


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
    turn_2 = _turn_2(reply)
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
    turn_2 = _turn_2(reply)
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


# -- a /v1 chat that keeps its conversation as a state ------------------------------------------

PERSIST = {"persist": True, "allow_experimental": True}


def _chat(client: httpx.Client, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    body = {"model": "demo", "messages": messages, "max_tokens": 8, "temperature": 0}
    return client.post("/v1/chat/completions", json={**body, **extra}, timeout=300)


def _states(client: httpx.Client) -> list[str]:
    return [s["id"] for s in client.get("/werk/v1/states").json()["states"]]


def _counted(client: httpx.Client, metric: str) -> int:
    """A histogram's count in ``/metrics``."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(f"{metric}_count "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no {metric}_count in /metrics")


def _commits(client: httpx.Client) -> int:
    """How many states the server has written to its disk store."""
    return _counted(client, "werk_store_commit_duration_seconds")


def _restores(client: httpx.Client) -> int:
    """How many disk states the server has restored into its backend."""
    return _counted(client, "werk_state_restore_duration_seconds")


def test_a_v1_chat_with_werk_persist_continues_each_turn_and_keeps_one_state(home: Path) -> None:
    with _serve(home) as first, first.client(KEY_A) as alice:
        answer = _chat(alice, TURN_1, werk=PERSIST)
        assert answer.status_code == 200, answer.text
        one = answer.json()
        assert one["object"] == "chat.completion"
        assert one["system_fingerprint"].startswith("g_")  # the llama-server's generation
        assert one["werk"]["reuse"]["outcome"] == "fresh" and one["werk"]["superseded"] == []
        reply_1 = one["choices"][0]["message"]["content"]
        assert one["choices"][0]["finish_reason"] in ("stop", "length")
        assert _states(alice) == [one["werk"]["state_id"]]
        refused = _chat(alice, TURN_1, werk=PERSIST, tools=[])
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
        plain = _chat(alice, TURN_1, werk={"persist": False})  # relayed, `werk` not forwarded
        assert plain.status_code == 200 and "werk" not in plain.json()
    # The conversation's state holds turn 1 and its reply, not only turn 1's prompt.
    assert one["werk"]["state_tokens"] > one["usage"]["prompt_tokens"]
    turn_2 = _turn_2(reply_1)
    with _serve(home) as second, second.client(KEY_A) as alice:  # a restart in between
        two = _chat(alice, turn_2, werk=PERSIST).json()
        state = two["werk"]
        assert state["reuse"]["match"] == "prefix"
        assert state["reuse"]["state_id"] == one["werk"]["state_id"]
        kept = one["werk"]["state_tokens"]
        assert state["reuse"]["restored_tokens"] == kept
        assert two["usage"]["prompt_tokens_details"]["cached_tokens"] == kept
        # only turn 2's own message was evaluated: the reply came with the restored state
        assert state["evaluated_tokens"] == two["usage"]["prompt_tokens"] - kept
        assert (
            state["evaluated_tokens"]
            < two["usage"]["prompt_tokens"] - one["usage"]["prompt_tokens"]
        )
        assert state["superseded"] == [one["werk"]["state_id"]]
        assert state["state_tokens"] > two["usage"]["prompt_tokens"]
        assert _states(alice) == [state["state_id"]]  # one state per conversation
        # the continued state (turn 1 with its reply, then turn 2) answers as a cold chat does
        cold = _chat(alice, turn_2).json()
        assert cold["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0
        assert two["choices"][0]["message"] == cold["choices"][0]["message"]
        turn_3 = [
            *turn_2,
            {"role": "assistant", "content": two["choices"][0]["message"]["content"]},
        ]
        turn_3.append({"role": "user", "content": "Thank you."})
        # Prefix continuation is proven by now: the turn writes one state, the one with its
        # reply (its prompt is not written first). The state it continues was written on this
        # server from the slot turn 2's reply was decoded in, which still holds it: that live
        # state is continued, nothing is restored from disk.
        assert _row(alice)["status"] == "experimental"
        commits, restores = _commits(alice), _restores(alice)
        with alice.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": "demo",
                "messages": turn_3,
                "max_tokens": 4,
                "stream": True,
                "werk": PERSIST,
            },
            timeout=300,
        ) as streamed:
            assert streamed.headers["content-type"].startswith("text/event-stream")
            events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] in ("stop", "length")
        # the reply streamed as llama-server generated it: a piece per chunk, not in one
        pieces = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[1:-2]]
        assert all(pieces) and len(pieces) >= min(2, last["usage"]["completion_tokens"])
        assert last["werk"]["reuse"]["match"] == "prefix"
        assert last["werk"]["reuse"]["state_id"] == state["state_id"]
        assert last["werk"]["reuse"]["restored_tokens"] is None
        assert last["usage"]["prompt_tokens_details"]["cached_tokens"] == state["state_tokens"]
        assert last["werk"]["evaluated_tokens"] == (
            last["usage"]["prompt_tokens"] - state["state_tokens"]
        )
        assert last["werk"]["superseded"] == [state["state_id"]]
        assert _states(alice) == [last["werk"]["state_id"]]
        assert (_commits(alice), _restores(alice)) == (commits + 1, restores)
        assert last["werk"]["state_tokens"] > last["usage"]["prompt_tokens"]


def test_conversations_sharing_a_system_prompt_keep_their_own_states(home: Path) -> None:
    """Bob's first turn continues Alice's state where they share the system prompt, but does
    not delete it: Alice's next turn continues her own state. Bob's turn continued the live
    state Alice's was written from (and changed it), so Alice's state comes from disk."""
    with _serve(home) as server, server.client(KEY_A) as client:
        alice = [SYSTEM, {"role": "user", "content": "Which clock is the oldest one here?"}]
        a1 = _chat(client, alice, werk=PERSIST).json()
        bob = [SYSTEM, {"role": "user", "content": "Who rings the bell at noon?"}]
        b1 = _chat(client, bob, werk=PERSIST).json()
        assert b1["werk"]["reuse"]["state_id"] == a1["werk"]["state_id"]  # the shared start
        assert b1["werk"]["reuse"]["restored_tokens"] is None  # Alice's live state, in place
        assert b1["werk"]["superseded"] == []
        assert sorted(_states(client)) == sorted([a1["werk"]["state_id"], b1["werk"]["state_id"]])
        alice += [
            {"role": "assistant", "content": a1["choices"][0]["message"]["content"]},
            {"role": "user", "content": "And who winds it?"},
        ]
        restores = _restores(client)
        a2 = _chat(client, alice, werk=PERSIST).json()
        assert a2["werk"]["reuse"]["state_id"] == a1["werk"]["state_id"]
        assert a2["werk"]["reuse"]["restored_tokens"] == a1["werk"]["state_tokens"]
        assert _restores(client) == restores + 1
        assert a2["werk"]["evaluated_tokens"] == (
            a2["usage"]["prompt_tokens"] - a1["werk"]["state_tokens"]
        )
        assert a2["werk"]["superseded"] == [a1["werk"]["state_id"]]
        assert sorted(_states(client)) == sorted([a2["werk"]["state_id"], b1["werk"]["state_id"]])


def test_a_turn_whose_live_state_is_gone_continues_the_disk_copy(home: Path) -> None:
    """Another prompt's prefill takes the one state slot between two turns: the live state the
    first turn's state was written from is gone, the backend refuses to continue it, and the
    turn continues the disk copy instead — restored, only the new message evaluated."""
    with _serve(home) as server, server.client(KEY_A) as client:
        one = _chat(client, TURN_1, werk=PERSIST).json()
        other = [{"role": "user", "content": "Something else entirely, please."}]
        _decode(client, _prefill(client, other, reuse="disabled")["handoff"]["token"])
        restores = _restores(client)
        two = _chat(client, _turn_2(one["choices"][0]["message"]["content"]), werk=PERSIST).json()
        assert two["werk"]["reuse"]["state_id"] == one["werk"]["state_id"]
        assert two["werk"]["reuse"]["restored_tokens"] == one["werk"]["state_tokens"]
        assert _restores(client) == restores + 1
        assert two["werk"]["evaluated_tokens"] == (
            two["usage"]["prompt_tokens"] - one["werk"]["state_tokens"]
        )
        assert two["werk"]["superseded"] == [one["werk"]["state_id"]]


def test_a_client_that_leaves_a_streamed_persisted_turn_ends_it(home: Path) -> None:
    """The client reads the first piece of a long reply and closes the stream: the turn is
    cancelled — nothing of it is kept — and the next turn of the conversation is served."""
    with _serve(home) as server, server.client(KEY_A) as client:
        one = _chat(client, TURN_1, werk=PERSIST).json()
        turn_2 = _turn_2(one["choices"][0]["message"]["content"])
        body = {"model": "demo", "messages": turn_2, "max_tokens": 2000, "temperature": 0}
        body["stream"] = True
        with client.stream(
            "POST", "/v1/chat/completions", json={**body, "werk": PERSIST}, timeout=300
        ) as streamed:
            lines = streamed.iter_lines()
            assert next(line for line in lines if '"content":"' in line and '"role"' not in line)
        assert _states(client) == [one["werk"]["state_id"]]  # the left turn kept nothing
        again = _chat(client, turn_2, werk=PERSIST)
        assert again.status_code == 200, again.text
        assert again.json()["werk"]["reuse"]["state_id"] == one["werk"]["state_id"]


def test_werk_chat_server_session_continues_its_state_on_the_server(
    home: Path, tmp_path: Path
) -> None:
    env = server_env(home, None, e2e._env())
    env["WERK_API_KEY"] = KEY_A
    with _serve(home) as server:
        argv = [str(WERK), "run", "demo", "--server", server.base_url, "--session", "talk", "-v"]
        argv += ["--temperature", "0", "--max-tokens", "4"]
        first = subprocess.run(
            [*argv, "Which clock is oldest?"], env=env, capture_output=True, text=True, timeout=300
        )
        assert first.returncode == 0, first.stderr
        assert "reuse fresh" in first.stderr, first.stderr
        second = subprocess.run(
            [*argv, "Who winds it?"], env=env, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 0, second.stderr
        assert "reuse reused (prefix)" in second.stderr, second.stderr
        with server.client(KEY_A) as alice:
            assert len(_states(alice)) == 1


def test_concurrent_persisted_conversations_each_keep_and_continue_their_own_state(
    home: Path,
) -> None:
    """Four clients, each its own two-turn persisted conversation, at the same time, on the one
    state slot: every turn answers and keeps its reply, every second turn continues its own
    first turn's state and evaluates only its own message (llama-server's cached count), and
    each conversation ends with exactly one state. (How a decoded state survives another state
    taking the slot is checked in test_llamacpp_states.py.)"""
    from concurrent.futures import ThreadPoolExecutor

    def converse(server: WerkServer, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        messages = [SYSTEM, {"role": "user", "content": f"Which clock is number {n}?"}]
        with server.client(KEY_A) as client:
            first = _chat(client, messages, werk=PERSIST)
            assert first.status_code == 200, first.text
            one = first.json()
            messages += [
                {"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                {"role": "user", "content": "Who winds it?"},
            ]
            second = _chat(client, messages, werk=PERSIST)
            assert second.status_code == 200, second.text
            return one, second.json()

    with _serve(home) as server, ThreadPoolExecutor(4) as pool:
        turns = list(pool.map(lambda n: converse(server, n), range(4)))
        with server.client(KEY_A) as alice:
            kept = sorted(_states(alice))
    for one, two in turns:
        for turn in (one, two):  # the reply is in the conversation's state
            assert turn["werk"]["state_tokens"] > turn["usage"]["prompt_tokens"], turn["werk"]
        assert two["werk"]["reuse"]["match"] == "prefix"
        assert two["werk"]["reuse"]["state_id"] == one["werk"]["state_id"]  # its own, no other
        # (restored_tokens may be null here: a restored state spilled for another before its
        # prefill ran is brought back from the spill) — llama-server's own count:
        cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == one["werk"]["state_tokens"]
        assert two["werk"]["evaluated_tokens"] == (
            two["usage"]["prompt_tokens"] - one["werk"]["state_tokens"]
        )
        assert two["werk"]["superseded"] == [one["werk"]["state_id"]]
    assert kept == sorted(two["werk"]["state_id"] for _, two in turns)
