"""Named states under concurrent clients, end to end: 8 clients doing prefill → decode pairs
against one real ``werk serve --model demo`` and its managed llama-server (one state slot).

Every pair must succeed, or be refused with a retryable ``429`` that says when to come back;
and every decode must continue *its own* prompt: its greedy text equals the uninterrupted
generation of that prompt (``/v1/completions``, measured before the clients start). A state
whose slot another client's prefill needed is spilled and restored, or restored from its disk
copy; it is never lost, mixed up with another client's, or silently evaluated again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_llamacpp_states_e2e import _create_demo, _env
from test_llamacpp_states_support import needs_llama_server

from werk.testing.server import WerkServer, werk_serve

pytestmark = [pytest.mark.slow, needs_llama_server]

CLIENTS = 8
PAIRS = 4  # per client
MAX_TOKENS = 10
PROMPTS = [
    f"Client {i} writes a short story about a {animal} who repairs clocks in a small town."
    for i, animal in enumerate(
        ["fox", "heron", "badger", "otter", "lynx", "crow", "hare", "moth"], start=1
    )
]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[WerkServer]:
    home = tmp_path / "home"
    home.mkdir()
    _create_demo(home, _env())
    with werk_serve(home, None, ["--model", "demo"], env=_env(), startup_timeout=60) as server:
        yield server


def _uninterrupted(client: httpx.Client, prompt: str) -> str:
    answer = client.post(
        "/v1/completions",
        json={"model": "demo", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    text: str = answer.json()["choices"][0]["text"]
    return text


def _pair(client: httpx.Client, prompt: str, policy: dict[str, Any]) -> tuple[str, Any]:
    """One prefill → decode; ``("ok", text)`` or ``("429", response)``."""
    body = {"model": "demo", "prompt": prompt, "allow_experimental": True, "policy": policy}
    prefilled = client.post("/werk/v1/prefill", json=body, timeout=120)
    if prefilled.status_code == 429:
        return "429", prefilled
    assert prefilled.status_code == 200, prefilled.text
    token = prefilled.json()["handoff"]["token"]
    decoded = client.post(
        "/werk/v1/decode", json={"handoff": token, "max_tokens": MAX_TOKENS}, timeout=120
    )
    if decoded.status_code == 429:
        return "429", decoded
    assert decoded.status_code == 200, decoded.text
    return "ok", decoded.json()["text"]


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param({"retention": "disk", "reuse": "prefer"}, id="disk"),
        pytest.param({"retention": "ephemeral", "reuse": "disabled"}, id="ephemeral"),
    ],
)
def test_eight_clients_prefill_and_decode_their_own_states(
    served: WerkServer, policy: dict[str, Any]
) -> None:
    with served.client() as client:
        expected = [_uninterrupted(client, prompt) for prompt in PROMPTS]
    assert len(set(expected)) > 1, "the prompts must continue differently to tell them apart"
    results: list[list[tuple[str, Any]]] = [[] for _ in PROMPTS]
    failures: list[BaseException] = []
    start = threading.Barrier(CLIENTS)

    def run(index: int) -> None:
        try:
            with served.client() as client:
                start.wait()
                for _ in range(PAIRS):
                    results[index].append(_pair(client, PROMPTS[index], policy))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not failures, failures[0]
    done = 0
    for index, outcomes in enumerate(results):
        assert len(outcomes) == PAIRS
        for kind, value in outcomes:
            if kind == "429":
                error = value.json()["error"]
                assert error["retryable"] is True, error
                assert int(value.headers["Retry-After"]) >= 1
                continue
            assert value == expected[index], (index, value, expected[index])
            done += 1
    assert done >= CLIENTS * PAIRS // 2, f"only {done} of {CLIENTS * PAIRS} pairs were served"


def test_a_state_whose_hold_ended_decodes_from_its_disk_copy(tmp_path: Path) -> None:
    """A state is kept for its decode for ``state_hold_seconds`` (a model option, here 1 s).
    After that its slot goes to the next state without a spill: a disk state's decode restores
    its disk copy (hash-verified by Werk's store), an ephemeral one is refused with a 409 that
    says to prefill again."""
    home = tmp_path / "home"
    home.mkdir()
    _create_demo(home, _env())
    manifest = home / "models" / "demo.json"
    data = json.loads(manifest.read_text())
    data["options"] = {**data.get("options", {}), "state_hold_seconds": 1}
    manifest.write_text(json.dumps(data))
    with (
        werk_serve(home, None, ["--model", "demo"], env=_env(), startup_timeout=60) as server,
        server.client() as client,
    ):
        expected = _uninterrupted(client, PROMPTS[0])

        def prefill(prompt: str, retention: str) -> str:
            body = {"model": "demo", "prompt": prompt, "allow_experimental": True,
                    "policy": {"retention": retention, "reuse": "disabled"}}  # fmt: skip
            answer = client.post("/werk/v1/prefill", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            token: str = answer.json()["handoff"]["token"]
            return token

        def decode(token: str) -> httpx.Response:
            body = {"handoff": token, "max_tokens": MAX_TOKENS}
            return client.post("/werk/v1/decode", json=body, timeout=120)

        on_disk = prefill(PROMPTS[0], "disk")
        time.sleep(1.5)
        prefill(PROMPTS[1], "ephemeral")  # takes the one state slot: nothing held it
        decoded = decode(on_disk)
        assert decoded.status_code == 200, decoded.text
        assert decoded.json()["text"] == expected

        gone = prefill(PROMPTS[2], "ephemeral")
        time.sleep(1.5)
        prefill(PROMPTS[3], "ephemeral")
        refused = decode(gone)
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "reuse_unavailable"
        assert "prefill again" in refused.json()["error"]["message"]
