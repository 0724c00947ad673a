"""Named states that survive a restart (issue 17), end to end with the real llama-server and
the demo model over HTTP:

* a 1,000-token prefix prefilled to disk, then ``werk serve`` stopped with SIGTERM, killed with
  SIGKILL, or its llama-server child killed: after each, a Prefill with ``reuse: required``
  restores it into the new process generation (the backend reports >= 990 cached tokens) and
  the greedy decode equals the one before the restart;
* ``runtime.state.restore.cross_restart`` per condition: no earlier generation (the first
  server), probe passed (after a restart: the early probe of the preloaded generation proves
  it before any request), probe failed (a corrupted canary: the required reuse is refused
  with the row's reason);
* a changed envelope — another ``--ctx-size`` or a replaced executable with another
  fingerprint — is ``incompatible_state``, and the state is listed ``reusable: false`` with the
  reason.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_llamacpp_states_e2e as e2e
from test_llamacpp_states_support import LLAMA_SERVER, needs_llama_server

from werk.testing.server import WerkServer, werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]

CROSS = "runtime.state.restore.cross_restart"
# ~1,030 tokens for the demo's byte-level tokenizer (a token per byte, but for a few merges).
PREFIX = "".join(f"Line {i:04d}: a clock ticks in the workshop. " for i in range(30))[:1200]
DISK_REQUIRED = {"retention": "disk", "reuse": "required"}


def prefill(client: httpx.Client, policy: dict[str, str]) -> httpx.Response:
    body = {"model": "demo", "prompt": PREFIX, "allow_experimental": True, "policy": policy}
    return client.post("/werk/v1/prefill", json=body, timeout=300)


def decode(client: httpx.Client, token: str) -> str:
    response = client.post(
        "/werk/v1/decode",
        json={"handoff": token, "max_tokens": 16, "temperature": 0},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    text: str = response.json()["text"]
    return text


def cross_row(client: httpx.Client) -> dict[str, Any]:
    rows = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()["capabilities"]
    [row] = [r for r in rows if r["id"] == CROSS]
    return row


def listed(client: httpx.Client, state_id: str) -> dict[str, Any]:
    [state] = [s for s in client.get("/werk/v1/states").json()["states"] if s["id"] == state_id]
    return state


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    e2e._create_demo(made, e2e._env())
    return made


def serve(home: Path, env: dict[str, str] | None = None) -> Iterator[WerkServer]:
    return werk_serve(  # type: ignore[no-any-return]
        home, None, ["--model", "demo"], env={**e2e._env(), **(env or {})}, startup_timeout=60
    )


def reuse_after_restart(
    server: WerkServer, state_id: str, expected: str, *, preloaded: bool = True
) -> str:
    """A required-reuse prefill in a new generation: the earlier state, its tokens reused.

    ``preloaded``: the new generation started with the server (``werk serve`` preloads), so
    its early probe proves the canary before any request; otherwise no runtime is loaded and
    the Prefill starts one (and waits for its probe)."""
    with server.client() as client:
        if preloaded:
            e2e._wait_for(
                lambda: cross_row(client)["status"] == "experimental", "the early probe", 60
            )
            before = listed(client, state_id)
            assert before["reusable"] is True, before
        else:
            before = listed(client, state_id)
            assert before["reusable"] is False
            assert "no runtime of model 'demo' is loaded" in before["reusable_reason"], before
        again = prefill(client, DISK_REQUIRED)
        assert again.status_code == 200, again.text
        body = again.json()
        reuse = body["reuse"]
        assert (reuse["outcome"], reuse["state_id"], reuse["match"]) == (
            "reused",
            state_id,
            "exact",
        )
        assert body["usage"]["cached_tokens"] >= 990, body["usage"]
        assert decode(client, body["handoff"]["token"]) == expected
        [figures] = client.get("/werk/v1/stats").json()["models"]
        assert figures["restores"]["verified"] >= 1 and figures["restores"]["refused"] == 0
        assert figures["cached_tokens"] >= body["usage"]["cached_tokens"]
        row = cross_row(client)
        assert row["status"] == "experimental", row
        after = listed(client, state_id)
        assert after["reusable"] is True and after["reusable_reason"] is None
        return str(row["reason"])


def test_a_disk_state_survives_sigterm_sigkill_and_a_killed_child(home: Path) -> None:
    with serve(home) as first, first.client() as client:
        row = cross_row(client)
        assert row["status"] == "unavailable"
        made = prefill(client, {"retention": "disk", "reuse": "prefer"})
        assert made.status_code == 200, made.text
        body = made.json()
        assert body["usage"]["prompt_tokens"] >= 1000
        state_id = body["state"]["id"]
        expected = decode(client, body["handoff"]["token"])
        row = cross_row(client)  # the first generation: nothing earlier to prove against
        assert row["status"] == "unavailable"
        assert "no earlier process generation" in row["reason"]
    # SIGTERM (the context's stop): a new server, a new generation.
    with serve(home) as second:
        reason = reuse_after_restart(second, state_id, expected)
        print(f"after SIGTERM: {reason}")
        second.stop(signal.SIGKILL)
    # SIGKILL of werk serve.
    with serve(home) as third:
        print(f"after SIGKILL of werk serve: {reuse_after_restart(third, state_id, expected)}")
        # SIGKILL of the llama-server child: the next request starts a new generation.
        child = e2e.ManagedChild(third)
        os.kill(child.pid, signal.SIGKILL)
        with third.client() as client:
            e2e._wait_for(lambda: cross_row(client)["status"] == "unavailable", "the child's death")
        reason = reuse_after_restart(third, state_id, expected, preloaded=False)
        print(f"after SIGKILL of the child: {reason}")


def test_a_changed_envelope_is_incompatible_and_listed_with_the_reason(
    home: Path, tmp_path: Path
) -> None:
    with serve(home) as first, first.client() as client:
        made = prefill(client, {"retention": "disk", "reuse": "prefer"})
        assert made.status_code == 200, made.text
        state_id = made.json()["state"]["id"]
    assert LLAMA_SERVER is not None
    copy = tmp_path / "bin" / "llama-server"
    copy.parent.mkdir()
    shutil.copy2(LLAMA_SERVER, copy)
    with copy.open("ab") as binary:
        binary.write(b"\0werk-test")  # another fingerprint; ELF ignores trailing bytes
    cases = {
        "another --ctx-size": ({"WERK_LLAMA_ARGS": "--ctx-size 8192"}, "runtime arguments"),
        "another executable": ({"WERK_LLAMA_SERVER": str(copy)}, "backend executable"),
    }
    for name, (env, dimension) in cases.items():
        with serve(home, env) as server, server.client() as client:
            refused = prefill(client, DISK_REQUIRED)
            assert refused.status_code == 409, (name, refused.text)
            assert refused.json()["error"]["code"] == "incompatible_state", name
            state = listed(client, state_id)
            assert state["reusable"] is False, name
            assert "incompatible: made by a runtime that differs in" in state["reusable_reason"]
            assert dimension in state["reusable_reason"], (name, state)
            print(f"{name}: {state['reusable_reason']}")


def test_a_corrupted_canary_fails_the_proof(home: Path) -> None:
    with serve(home) as first, first.client() as client:
        made = prefill(client, {"retention": "disk", "reuse": "prefer"})
        assert made.status_code == 200, made.text
        state_id = made.json()["state"]["id"]
        expected = decode(client, made.json()["handoff"]["token"])
    [canary] = (home / "canaries" / "llamacpp").iterdir()
    slot_file = canary / "slot.bin"
    data = bytearray(slot_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    slot_file.write_bytes(bytes(data))
    with serve(home) as second, second.client() as client:
        # The preloaded generation's early probe finds the canary and fails the proof.
        e2e._wait_for(
            lambda: "recorded digest" in (cross_row(client)["reason"] or ""), "the early probe", 60
        )
        row = cross_row(client)
        assert row["status"] == "unavailable"
        assert "does not match its recorded digest" in row["reason"]
        state = listed(client, state_id)
        assert state["reusable"] is False
        refused = prefill(client, DISK_REQUIRED)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "incompatible_state"
        assert error["capability"] == CROSS
        assert "does not match its recorded digest" in error["message"]
        # Refused by the host from that row: the state was never handed to the backend.
        assert client.get("/werk/v1/stats").json()["models"] == []
    # The failed proof left this generation's own canary: the next restart proves again.
    with serve(home) as third:
        reuse_after_restart(third, state_id, expected)
