"""The real Transformers worker (torch + Transformers, managed environment) behind a real
``werk serve``: chat and text completions on tiny generated Llamas.

Streamed and whole answers agree; a seed reproduces a sampled answer; stop strings, refusals
that keep the worker warm, concurrent clients served in turn, a client that leaves mid-stream
(the generation is cancelled, the worker stays), a worker killed mid-generation (typed error,
reaped, the next request starts a cold one), the model LRU with
``WERK_TRANSFORMERS_MODEL_CACHE_SIZE`` 1 and 2, no worker left when ``werk serve`` is
SIGKILLed, and the conformance kit from a shell.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from transformers_testing import (
    KEY,
    MODEL_A,
    MODEL_B,
    chat,
    chat_body,
    events,
    require_backends,
    residency,
    streamed_text,
    werk,
    workers,
)

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow


def _serve(home: Path, cache_size: str = "1") -> Iterator[WerkServer]:
    extra = {
        "WERK_BACKENDS_DIR": require_backends(),
        "WERK_TRANSFORMERS_MODEL_CACHE_SIZE": cache_size,
    }
    args = ["--model", MODEL_A, "--model", MODEL_B, "--api-key", KEY]
    # --no-preload: these tests show residency before and after the first request
    with werk_serve(home, None, [*args, "--no-preload"], env=extra) as server:
        yield server


@pytest.fixture(scope="module")
def served(transformers_home: Path) -> Iterator[WerkServer]:
    yield from _serve(transformers_home)


def test_load_starts_the_worker_before_any_request(served: WerkServer) -> None:
    before = residency(served, MODEL_A)
    assert before["status"] == "supported" and before["operations"] == ["load"]
    assert "no transformers worker is running" in before["reason"]
    with served.client(KEY, timeout=300) as http:
        loaded = http.post(f"/werk/v1/models/{MODEL_A}/load", json={"dry_run": False})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json() == {"model": MODEL_A, "resident": True}
    after = residency(served, MODEL_A)
    assert after["reason"].startswith("its model is resident; the transformers worker (pid")
    assert after["operations"] == ["load", "unload"]
    (worker,) = workers(served)
    assert f"(pid {worker.pid})" in after["reason"]


def test_a_streamed_chat_says_what_the_whole_answer_says(served: WerkServer) -> None:
    whole = chat(served)
    assert whole.status_code == 200, whole.text
    body = whole.json()
    assert body["object"] == "chat.completion" and body["model"] == MODEL_A
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12
    with served.client(KEY, timeout=300) as http:
        streamed = http.post(
            "/v1/chat/completions",
            json=chat_body(stream=True, stream_options={"include_usage": True}),
        )
    assert streamed.status_code == 200, streamed.text
    payloads = events(streamed)
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert len({p["id"] for p in payloads}) == 1
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"] == body["usage"]
    assert streamed_text(payloads) == choice["message"]["content"]  # greedy: the same tokens


def test_a_text_completion_streamed_and_not(served: WerkServer) -> None:
    prompt = {"model": MODEL_A, "prompt": "The quick brown", "max_tokens": 6, "temperature": 0}
    with served.client(KEY, timeout=300) as http:
        whole = http.post("/v1/completions", json=prompt)
        streamed = http.post("/v1/completions", json=prompt | {"stream": True})
    assert whole.status_code == 200, whole.text
    (choice,) = whole.json()["choices"]
    assert whole.json()["object"] == "text_completion"
    assert whole.json()["usage"]["completion_tokens"] == 6
    payloads = events(streamed)
    assert streamed_text(payloads) == choice["text"]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


def test_a_seed_reproduces_a_sampled_answer(served: WerkServer) -> None:
    def sampled(seed: int) -> str:
        response = chat(served, temperature=1.0, top_p=0.9, seed=seed, max_tokens=16)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])

    assert sampled(7) == sampled(7)
    assert sampled(7) != sampled(8)  # 16 draws from a ~500-token vocabulary


def test_a_stop_string_ends_the_answer_before_it(served: WerkServer) -> None:
    full = chat(served, max_tokens=24).json()["choices"][0]["message"]["content"]
    stop = full[10:14]
    cut = chat(served, max_tokens=24, stop=[stop]).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["message"]["content"] == full[: full.index(stop)]


@pytest.mark.parametrize(
    ("fields", "status", "text"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, 501, "tool calling"),
        ({"n": 2}, 501, "one choice"),
        ({"logprobs": True}, 501, "log-probabilities"),
        ({"temperature": 3}, 400, "'temperature' must be a number in [0, 2]"),
        ({"frobnicate": 1}, 400, "unknown field(s) for /v1/chat/completions: frobnicate"),
        ({"stop": ["a", "b", "c", "d", "e"]}, 400, "at most 4"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            501,
            "serves text",
        ),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "context is 2048"),
    ],
)
def test_what_it_cannot_honour_is_refused_and_the_worker_stays(
    served: WerkServer, fields: dict[str, object], status: int, text: str
) -> None:
    assert chat(served).status_code == 200
    (before,) = workers(served)
    response = chat(served, **fields)
    assert response.status_code == status, response.text
    assert text in response.json()["error"]["message"]
    (after,) = workers(served)
    assert after.pid == before.pid


def test_concurrent_clients_are_served_in_turn(served: WerkServer) -> None:
    expected = chat(served).json()["choices"][0]["message"]["content"]
    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(lambda _: chat(served), range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert {r.json()["choices"][0]["message"]["content"] for r in responses} == {expected}


def test_a_client_that_leaves_mid_stream_cancels_and_the_worker_stays_warm(
    served: WerkServer,
) -> None:
    assert chat(served).status_code == 200
    (worker,) = workers(served)
    with served.client(KEY, timeout=300) as http:
        body = chat_body(stream=True, max_tokens=2000)
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert [next(lines) for _ in range(6)]  # the first chunks, then the client goes
    after = chat(served)
    assert after.status_code == 200, after.text
    (still,) = workers(served)
    assert still.pid == worker.pid


def test_a_worker_killed_mid_generation_fails_the_stream_and_the_next_starts_cold(
    served: WerkServer,
) -> None:
    assert chat(served).status_code == 200
    (worker,) = workers(served)
    with served.client(KEY, timeout=300) as http:
        body = chat_body(stream=True, max_tokens=2000)
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            lines = response.iter_lines()
            assert [next(lines) for _ in range(4)]
            worker.send_signal(signal.SIGKILL)
            rest = list(lines)
    errors = [line for line in rest if line.startswith('data: {"error"')]
    assert errors, rest[-5:]
    assert '"code": "backend_error"' in errors[0] or '"code":"backend_error"' in errors[0]
    assert "the transformers worker exited during execute" in errors[0]
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(worker.pid)  # reaped by werk serve, not left a zombie
    gone = residency(served, MODEL_A)
    assert gone["reason"].startswith("no transformers worker is running")
    again = chat(served)
    assert again.status_code == 200, again.text
    (fresh,) = workers(served)
    assert fresh.pid != worker.pid


def _lru(home: Path, cache_size: str) -> tuple[str, str, str]:
    """Chat with A, then B, then A; the reasons of A's and B's rows after B, and A's after
    the second A."""
    for server in _serve(home, cache_size):
        assert chat(server, MODEL_A).status_code == 200
        assert chat(server, MODEL_B).status_code == 200
        a, b = residency(server, MODEL_A)["reason"], residency(server, MODEL_B)["reason"]
        assert chat(server, MODEL_A).status_code == 200
        return a, b, residency(server, MODEL_A)["reason"]
    raise AssertionError("werk serve did not start")


def _resident_bytes(reason: str) -> int:
    found = re.search(r", (\d+) bytes of parameters and buffers", reason)
    assert found, reason
    return int(found.group(1))


def _weight_bytes(home: Path, model: str) -> int:
    return sum(p.stat().st_size for p in (home / "models" / "files" / model).rglob("*.safetensors"))


def test_with_one_model_slot_two_models_evict_and_reload(transformers_home: Path) -> None:
    a, b, a_again = _lru(transformers_home, "1")
    assert a.startswith("its model is not loaded now")
    assert b.startswith("its model is resident") and "keeps 1 of at most 1 model(s)" in b
    assert a_again.startswith("its model is resident")  # reloaded for its request
    weights = _weight_bytes(transformers_home, MODEL_B)
    assert 0.9 * weights <= _resident_bytes(b) <= 1.1 * weights


def test_with_two_model_slots_both_stay_loaded(transformers_home: Path) -> None:
    a, b, _ = _lru(transformers_home, "2")
    assert a.startswith("its model is resident") and b.startswith("its model is resident")
    assert "keeps 2 of at most 2 model(s)" in b
    weights = _weight_bytes(transformers_home, MODEL_A) + _weight_bytes(transformers_home, MODEL_B)
    assert 0.9 * weights <= _resident_bytes(b) <= 1.1 * weights


def test_sigkill_of_werk_serve_leaves_no_worker(transformers_home: Path) -> None:
    others = {p.pid for p in psutil.process_iter() if p.pid}  # the module's server's too
    for server in _serve(transformers_home):
        assert chat(server).status_code == 200
        pids = {w.pid for w in workers(server)} - others
        assert len(pids) == 1
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        deadline = time.monotonic() + 30
        while [w for w in workers(server) if w.pid in pids] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [w for w in workers(server) if w.pid in pids] == []


def test_the_conformance_kit_passes_from_a_shell(transformers_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(transformers_home), WERK_BACKENDS_DIR=require_backends())
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", "transformers", "--model", MODEL_A],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "/v1 stream closed by the client" in done.stdout
    assert re.search(r"\b(\d+) passed, 0 failed", done.stdout)


def test_a_model_that_is_not_a_text_generator_is_refused_at_load(
    transformers_home: Path, tmp_path: Path
) -> None:
    """A Transformers directory whose architecture does not generate text (here a config
    naming a classifier) is refused when it starts, in words that say why."""
    model = tmp_path / "classifier"
    model.mkdir()
    source = transformers_home / "models" / "files" / MODEL_A
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((source / name).read_bytes())
    config = (
        (source / "config.json")
        .read_text()
        .replace('"LlamaForCausalLM"', '"LlamaForSequenceClassification"')
    )
    (model / "config.json").write_text(config)
    home = tmp_path / "home"
    home.mkdir()
    imported = werk(
        home, "models", "import", str(model), "--id", "clf", "--backend", "transformers"
    )
    assert imported.returncode == 0, imported.stderr
    for server in _serve_one(home, "clf"):
        with server.client(KEY, timeout=300) as http:
            response = http.post("/v1/chat/completions", json=chat_body("clf"))
        assert response.status_code == 400, response.text
        assert "not a text-generation model" in response.json()["error"]["message"]


def _serve_one(home: Path, model: str) -> Iterator[WerkServer]:
    extra = {"WERK_BACKENDS_DIR": require_backends()}
    args = ["--model", model, "--api-key", KEY, "--no-preload"]
    with werk_serve(home, None, args, env=extra) as server:
        yield server
