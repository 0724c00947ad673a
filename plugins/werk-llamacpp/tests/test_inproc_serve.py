"""``llamacpp-inproc`` behind a real ``werk serve`` (the real llama-cpp-python build from the
managed environment ``make test`` installs; these tests fail, never skip, without
``WERK_BACKENDS_DIR``): the demo GGUF imported as ``demo-inproc`` with
``werk models create-demo --kind llamacpp-inproc``.

Two chats sharing a long system prompt (the second reports cached tokens from llama.cpp's own
counters; no child process exists), prefill → disk state → decode and prefill → memory (``ram``)
state → decode equal to an uninterrupted greedy generation, a ``ram`` state's bytes in Werk's
memory accounting until it is pruned, concurrent clients queued on the model's lane, a client
leaving mid-stream, states from another model file or other context settings refused as
``incompatible_state``, a disk state reused after a restart only once the canary proved it
(and not with a damaged canary), and the conformance kit from a shell.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

WERK = Path(sys.executable).parent / "werk"
MODEL = "demo-inproc"
KEY = "inproc-key-0123456789abcdef0123"
SYSTEM = "You are a careful assistant who answers in short sentences. " * 15
PROMPT = "Once upon a time, in a workshop full of clocks, a careful engineer wrote a test."
DISK = {"retention": "disk", "reuse": "prefer"}


def _backends() -> str:
    backends = os.environ.get("WERK_BACKENDS_DIR", "")
    if not backends:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test`")
    return backends


def werk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=_backends())
    return subprocess.run(
        [str(WERK), *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _import(home: Path, *options: str, seed: int = 0) -> None:
    made = werk(
        home, "models", "create-demo", "--kind", "llamacpp-inproc", "--id", MODEL,
        "--seed", str(seed), *options,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("inproc-serve")
    _import(made)
    return made


def _serve(home: Path) -> AbstractContextManager[WerkServer]:
    return werk_serve(
        home, None, ["--model", MODEL, "--api-key", KEY], env={"WERK_BACKENDS_DIR": _backends()}
    )


@pytest.fixture(scope="module")
def served(home: Path) -> Iterator[WerkServer]:
    with _serve(home) as server:
        yield server


def _post(server: WerkServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with server.client(KEY, timeout=300) as http:
        return http.post(path, json=body)


def _chat(server: WerkServer, user: str, **fields: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 6,
        "temperature": 0,
    }
    return _post(server, "/v1/chat/completions", body | fields)


def _prefill(server: WerkServer, policy: dict[str, Any], prompt: str = PROMPT) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "policy": policy, "allow_experimental": True}
    return _post(server, "/werk/v1/prefill", body)


def _decode(server: WerkServer, made: httpx.Response, max_tokens: int = 10) -> str:
    assert made.status_code == 200, made.text
    token = made.json()["handoff"]["token"]
    decoded = _post(server, "/werk/v1/decode", {"handoff": token, "max_tokens": max_tokens})
    assert decoded.status_code == 200, decoded.text
    return str(decoded.json()["text"])


def _serving_pid(server: WerkServer) -> int:
    return server.process.pid


def test_two_chats_sharing_a_system_prompt_reuse_it_without_a_child_process(
    served: WerkServer,
) -> None:
    first = _chat(served, "Hello there")
    assert first.status_code == 200, first.text
    second = _chat(served, "What does a clockmaker do?")
    assert second.status_code == 200, second.text
    one, two = first.json()["usage"], second.json()["usage"]
    print("first", one, "second", two)
    cached = two["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    evaluated_first = one["prompt_tokens"] - one["prompt_tokens_details"]["cached_tokens"]
    evaluated_second = two["prompt_tokens"] - cached
    assert evaluated_second < evaluated_first
    assert psutil.Process(_serving_pid(served)).children(recursive=True) == []
    ps = werk_json(served, "ps")
    (row,) = [r for r in ps["runtimes"] if r["model"] == MODEL]
    assert row["backend"] == "llamacpp-inproc" and row["pid"] is None


def werk_json(server: WerkServer, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_SERVER=server.base_url, WERK_API_KEY=KEY)
    done = subprocess.run(
        [str(WERK), *args, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_disk_and_memory_states_continue_like_an_uninterrupted_generation(
    served: WerkServer,
) -> None:
    whole = _post(
        served,
        "/v1/completions",
        {"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "temperature": 0},
    )
    assert whole.status_code == 200, whole.text
    expected = whole.json()["choices"][0]["text"]
    disk = _prefill(served, DISK)
    assert disk.json()["state"]["tier"] == "disk", disk.text
    assert _decode(served, disk) == expected
    with served.client(KEY) as http:
        before = http.get("/werk/v1/memory").json()["managed"]["allocated_bytes"]
    memory = _prefill(served, {"retention": "memory"})
    state = memory.json()["state"]
    assert state["tier"] == "ram" and state["logical_bytes"] > 0, memory.text
    assert _decode(served, memory) == expected
    with served.client(KEY) as http:
        held = http.get("/werk/v1/memory").json()["managed"]["allocated_bytes"]
        assert held == before + state["logical_bytes"]  # the state's bytes are accounted
        again = _prefill(served, {"retention": "memory", "reuse": "required"})
        assert again.json()["reuse"]["outcome"] == "reused", again.text
        assert _decode(served, again) == expected
        listed = http.get("/werk/v1/states", params={"tier": "ram"}).json()["states"]
        assert [s["id"] for s in listed] == [state["id"]]
        pruned = http.post("/werk/v1/states/prune", json={"ids": [state["id"]], "dry_run": False})
        assert pruned.json()["deleted"] == [state["id"]], pruned.text
        after = http.get("/werk/v1/memory").json()["managed"]["allocated_bytes"]
        assert after == before


def test_a_persisted_chat_keeps_its_reply_so_the_next_turn_evaluates_only_its_message(
    served: WerkServer,
) -> None:
    persist = {"werk": {"persist": True, "allow_experimental": True}}
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello."}]
    one = _post(served, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                "max_tokens": 6, "temperature": 0, **persist})  # fmt: skip
    assert one.status_code == 200, one.text
    first = one.json()
    kept = first["werk"]["state_tokens"]
    assert kept > first["usage"]["prompt_tokens"]  # the reply is in the state
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And then?"},
    ]
    two = _post(served, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                "max_tokens": 6, "temperature": 0, **persist})  # fmt: skip
    assert two.status_code == 200, two.text
    second = two.json()
    assert second["werk"]["reuse"]["state_id"] == first["werk"]["state_id"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == kept
    assert second["werk"]["evaluated_tokens"] == second["usage"]["prompt_tokens"] - kept
    assert second["werk"]["superseded"] == [first["werk"]["state_id"]]


def test_concurrent_clients_are_queued_not_refused(served: WerkServer) -> None:
    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(lambda i: _chat(served, f"Question number {i}?"), range(6)))
    assert [a.status_code for a in answers] == [200] * 6, [a.text for a in answers]
    with ThreadPoolExecutor(max_workers=4) as pool:
        states = list(pool.map(lambda i: _prefill(served, DISK, f"{PROMPT} {i}"), range(4)))
    assert [s.status_code for s in states] == [200] * 4, [s.text for s in states]


def test_a_client_leaving_mid_stream_frees_the_model(served: WerkServer) -> None:
    with served.client(KEY, timeout=120) as http:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Count to one hundred."}],
            "max_tokens": 400,
            "stream": True,
        }
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # leave after the first chunk
    answer = _chat(served, "Still there?")
    assert answer.status_code == 200, answer.text


def test_states_of_another_model_or_other_context_settings_are_incompatible(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _import(home)
    with _serve(home) as server:
        made = _prefill(server, DISK)
        assert made.status_code == 200, made.text
        state_id = made.json()["state"]["id"]
    model_file = home / "models" / "files" / f"{MODEL}.gguf"
    small = ("--backend", "llamacpp-inproc", "--option", "ctx_size=1024")
    cases = {
        "other context settings": (
            lambda: werk(home, "models", "import", str(model_file), "--id", MODEL, *small),
            "runtime arguments",
        ),
        "another model file": (lambda: _import(home, seed=1), "model identity"),
    }
    for name, (change, dimension) in cases.items():
        change()
        with _serve(home) as server, server.client(KEY) as http:
            refused = _prefill(server, {"retention": "disk", "reuse": "required"})
            assert refused.status_code == 409, (name, refused.text)
            assert refused.json()["error"]["code"] == "incompatible_state", name
            state = http.get(f"/werk/v1/states/{state_id}").json()
            assert state["reusable"] is False, (name, state)
            assert dimension in state["reusable_reason"], (name, state)
            print(f"{name}: {state['reusable_reason']}")


def _cross_row(server: WerkServer) -> dict[str, Any]:
    with server.client(KEY) as http:
        rows = http.get("/werk/v1/capabilities", params={"model": MODEL}).json()["capabilities"]
    return next(r for r in rows if r["id"] == "runtime.state.restore.cross_restart")


def test_a_disk_state_is_reused_after_a_restart_only_with_the_canary_proof(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    _import(home)
    with _serve(home) as first:
        made = _prefill(first, DISK)  # waits for the load and its probes
        row = _cross_row(first)
        assert row["status"] == "unavailable" and "no earlier werk serve process" in row["reason"]
        expected = _decode(first, made)
    with _serve(home) as second:
        again = _prefill(second, {"retention": "disk", "reuse": "required"})
        assert again.json()["reuse"]["outcome"] == "reused", again.text
        assert _decode(second, again) == expected
        row = _cross_row(second)
        assert row["status"] == "experimental", row
        assert "restored in generation" in row["reason"]
    (canary,) = (home / "canaries" / "llamacpp-inproc").iterdir()
    state = canary / "state.bin"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with _serve(home) as third:
        refused = _prefill(third, {"retention": "disk", "reuse": "required"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"]["code"] == "incompatible_state"
        row = _cross_row(third)
        assert row["status"] == "unavailable" and "checksum" in row["reason"], row
    with _serve(home) as fourth:  # the failed proof left the third's canary: proven again
        assert _chat(fourth, "hello").status_code == 200
        assert _cross_row(fourth)["status"] == "experimental"


def test_the_conformance_kit_passes_from_a_shell(home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=_backends())
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", "llamacpp-inproc", "--model", MODEL],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "claim runtime.state.tier.ram experimental" in done.stdout
    assert "claim runtime.state.restore.prefix experimental" in done.stdout
    assert "claim runtime.state.restore.cross_restart experimental" in done.stdout
