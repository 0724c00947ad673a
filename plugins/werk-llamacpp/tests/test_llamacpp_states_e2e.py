"""End to end: named states through a real ``werk serve --model demo`` and its managed llama-server.

Nothing is mocked: the real CLI creates and imports the demo GGUF, ``werk serve`` spawns the
real llama-server through the plugin's process layer, and every request goes over loopback HTTP.
The child is observed from outside through ``/proc`` (its command line gives its port and key for
controls behind Werk's back; its captured log gives the server's own per-task count of computed
prompt tokens) — which is how a decode that re-prefilled would be caught.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_llamacpp_states_support import LLAMA_SERVER, needs_llama_server, prompt_evals
from werk_llamacpp.probe import effective_arg

from werk.testing.server import WERK, WerkServer, server_env, werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]

PROMPT = "Once upon a time, in a workshop full of clocks, a careful engineer wrote a test."
GATED = (
    "runtime.state.prefix_cache",
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.tier.disk",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
)
DISK_PREFER = {"retention": "disk", "reuse": "prefer"}


def _env() -> dict[str, str]:
    assert LLAMA_SERVER is not None
    return {"WERK_LLAMA_SERVER": str(LLAMA_SERVER)}


def _create_demo(home: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [str(WERK), "models", "create-demo", "--id", "demo"],
        check=True,
        capture_output=True,
        env=server_env(home, None, env),
        timeout=300,
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


@pytest.fixture
def served(home: Path) -> Iterator[WerkServer]:
    _create_demo(home, _env())
    with werk_serve(home, None, ["--model", "demo"], env=_env(), startup_timeout=60) as server:
        yield server


# -- observing the managed child from outside -------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


class ManagedChild:
    """The llama-server that ``werk serve`` spawned, seen through ``/proc``."""

    def __init__(self, server: WerkServer) -> None:
        pids = [p for p in _children(server.process.pid) if self._is_llama(p)]
        assert len(pids) == 1, f"expected one llama-server child, found {pids}"
        self.pid = pids[0]
        with open(f"/proc/{self.pid}/cmdline", "rb") as f:
            self.args = [a.decode() for a in f.read().split(b"\0") if a]
        self.port = int(self._arg("--port"))
        self.key = self._arg("--api-key")
        self.log_path = Path(os.readlink(f"/proc/{self.pid}/fd/1"))

    @staticmethod
    def _is_llama(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"llama-server" in f.read().split(b"\0")[0]
        except FileNotFoundError:
            return False

    def _arg(self, name: str) -> str:
        return self.args[self.args.index(name) + 1]

    def direct(self) -> httpx.Client:
        return httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {self.key}"},
            timeout=60,
        )

    def state_slot(self) -> int:
        with self.direct() as direct:
            total: int = direct.get("/props").json()["total_slots"]
        return total - 1  # the process layer reserves the last slot for states

    def prompt_evals(self, slot: int) -> list[int]:
        """:func:`prompt_evals` once the log shows every slot's last task as ``/slots`` reports
        it: the logger thread can be a whole task behind the HTTP answer (launch line included;
        CI once read ``[]`` right after a decode), as in the support module's ``Child``."""
        with self.direct() as direct:
            slots = direct.get("/slots").json()
        last = [s["id_task"] for s in slots if isinstance(s.get("id_task"), int)]
        return prompt_evals(self.log_path, slot, finished=last)


def _rows(client: httpx.Client) -> dict[str, dict[str, Any]]:
    body = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()
    return {row["id"]: row for row in body["capabilities"] if row.get("model") == "demo"}


def _prefill(client: httpx.Client, **extra: Any) -> httpx.Response:
    body = {"model": "demo", "prompt": PROMPT, "allow_experimental": True, **extra}
    return client.post("/werk/v1/prefill", json=body, timeout=120)


def _decode(client: httpx.Client, token: str, max_tokens: int = 12) -> httpx.Response:
    return client.post(
        "/werk/v1/decode", json={"handoff": token, "max_tokens": max_tokens}, timeout=120
    )


def _wait_for(predicate: Any, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# -- the tests --------------------------------------------------------------------------------


def test_probe_prefill_persist_decode_reuse_and_restart(served: WerkServer) -> None:
    with served.client() as client:
        _probe_prefill_persist_decode_reuse_and_restart(served, client)


def _probe_prefill_persist_decode_reuse_and_restart(
    served: WerkServer, client: httpx.Client
) -> None:
    before = _rows(client)
    assert {cap: before[cap]["status"] for cap in GATED} == dict.fromkeys(GATED, "unavailable")

    first = _prefill(client, policy=DISK_PREFER)
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["state"]["tier"] == "disk" and body["reuse"]["outcome"] == "fresh"
    assert body["usage"]["cached_tokens"] == 0
    n = body["usage"]["prompt_tokens"]

    child = ManagedChild(served)
    generation = child.log_path.parent.name
    rows = _rows(client)
    for cap in GATED:
        assert rows[cap]["status"] == "experimental", rows[cap]
        assert generation in rows[cap]["reason"]
    # The RAM prompt cache is ruled out on this process; the control below shows a fresh slot
    # computes the whole prompt.
    assert effective_arg(child.args, ("--cache-ram", "-cram")) == "0"
    slot = child.state_slot()

    # Decode via the handoff: the server computed one prompt token (cache_n = n - 1).
    evals = len(child.prompt_evals(slot))
    decoded = _decode(client, body["handoff"]["token"])
    assert decoded.status_code == 200, decoded.text
    assert child.prompt_evals(slot)[evals:] == [1]
    control = client.post(
        "/v1/completions",
        json={"model": "demo", "prompt": PROMPT, "max_tokens": 12, "temperature": 0},
    ).json()
    assert control["timings"]["cache_n"] == 0 and control["timings"]["prompt_n"] == n
    assert decoded.json()["text"] == control["choices"][0]["text"]

    # A second prefill of the same prompt with reuse: prefer restores the disk state; the
    # restore put all n tokens in the slot (the server's acknowledgement) and nothing is
    # evaluated until the decode, which computes the last prompt token only.
    evals = len(child.prompt_evals(slot))
    second = _prefill(client, policy=DISK_PREFER)
    assert second.status_code == 200, second.text
    again = second.json()
    reuse = again["reuse"]
    assert (reuse["outcome"], reuse["state_id"], reuse["match"]) == (
        "reused",
        body["state"]["id"],
        "exact",
    )
    assert again["usage"] == {"prompt_tokens": n, "cached_tokens": n, "evaluated_tokens": 0}
    assert len(child.prompt_evals(slot)) == evals
    redecoded = _decode(client, again["handoff"]["token"])
    assert redecoded.json()["text"] == decoded.json()["text"]
    assert child.prompt_evals(slot)[evals:] == [1]

    # A decode whose state vanished behind Werk's back fails instead of re-prefilling quietly.
    third = _prefill(client, policy={"retention": "ephemeral"}).json()
    with child.direct() as direct:
        assert direct.post(f"/slots/{slot}?action=erase").json()["n_erased"] == n
    refused = _decode(client, third["handoff"]["token"])
    assert refused.status_code == 502, refused.text
    assert refused.json()["error"]["code"] == "backend_error"
    assert "re-prefill" in refused.json()["error"]["message"]

    # Kill the child: the statuses drop and the next request starts a new generation. Its
    # probe restores the canary the first generation left (issue 17: cross-restart proof), so
    # the disk state of the dead generation is reused; test_llamacpp_cross_restart.py covers
    # the conditions under which it is not.
    os.kill(child.pid, signal.SIGKILL)
    _wait_for(
        lambda: all(_rows(client)[cap]["status"] == "unavailable" for cap in GATED),
        "the statuses to drop after the child died",
    )
    required = _prefill(client, policy={"retention": "disk", "reuse": "required"})
    assert required.status_code == 200, required.text
    reuse = required.json()["reuse"]
    assert (reuse["outcome"], reuse["state_id"], reuse["match"]) == (
        "reused",
        body["state"]["id"],
        "exact",
    )
    assert required.json()["usage"] == {
        "prompt_tokens": n,
        "cached_tokens": n,
        "evaluated_tokens": 0,
    }
    respawned = ManagedChild(served)
    assert respawned.pid != child.pid
    new_generation = respawned.log_path.parent.name
    assert new_generation != generation
    rows = _rows(client)
    for cap in GATED:
        assert rows[cap]["status"] == "experimental"
        assert new_generation in rows[cap]["reason"] and generation not in rows[cap]["reason"]
    cross = rows["runtime.state.restore.cross_restart"]
    assert cross["status"] == "experimental"
    assert generation in cross["reason"] and new_generation in cross["reason"]
    assert (
        _decode(client, required.json()["handoff"]["token"]).json()["text"]
        == (decoded.json()["text"])
    )
    states = client.get("/werk/v1/states").json()["states"]
    assert {s["id"]: s["reusable"] for s in states} == {body["state"]["id"]: True}


STAND_IN = """#!/bin/sh
# Stands for a llama-server build that advertises --slot-save-path in its --help but does not
# honour it: the real executable, started with that option (and its value) dropped.
skip=0
for a in "$@"; do
  shift
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  if [ "$a" = "--slot-save-path" ]; then skip=1; continue; fi
  set -- "$@" "$a"
done
exec {real} "$@"
"""


def test_a_failed_probe_keeps_the_state_rows_unavailable(home: Path, tmp_path: Path) -> None:
    stand_in = tmp_path / "llama-server"
    stand_in.write_text(STAND_IN.format(real=LLAMA_SERVER))
    stand_in.chmod(stat.S_IRWXU)
    env = {"WERK_LLAMA_SERVER": str(stand_in)}
    _create_demo(home, env)
    with (
        werk_serve(home, None, ["--model", "demo"], env=env, startup_timeout=60) as server,
        server.client() as client,
    ):
        for attempt in (1, 2):
            refused = _prefill(client, policy=DISK_PREFER)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "unavailable"
            assert error["capability"] == "runtime.pd.prefill"
            assert "501" in error["message"], (attempt, error)
            rows = _rows(client)
            for cap in GATED:
                assert rows[cap]["status"] == "unavailable"
                assert "probe failed" in rows[cap]["reason"]
        # Plain inference through /v1 is unaffected.
        chat = client.post(
            "/v1/chat/completions",
            json={"model": "demo", "messages": [{"role": "user", "content": "hi"}],
                  "max_tokens": 4},
        )  # fmt: skip
        assert chat.status_code == 200, chat.text
