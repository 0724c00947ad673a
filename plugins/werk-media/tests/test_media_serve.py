"""The real media worker (torch + Diffusers, managed environment) behind a real ``werk serve``:
``POST /v1/images/generations`` on tiny generated Stable Diffusion pipelines.

Valid, reproducible PNGs (decoded by Pillow); bounds refused before any backend runs; the
residency row before and after the worker starts; a worker killed mid-generation (typed error,
reaped, the next request starts a cold one); the pipeline LRU with
``WERK_MEDIA_PIPELINE_CACHE_SIZE`` 1 and 2; and no worker left when ``werk serve`` is
SIGKILLed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from media_testing import (
    IMAGE_A,
    IMAGE_B,
    KEY,
    generate,
    png_of,
    require_backends,
    residency,
    workers,
)

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow


def _serve(home: Path, cache_size: str = "1") -> Iterator[WerkServer]:
    extra = {"WERK_BACKENDS_DIR": require_backends(), "WERK_MEDIA_PIPELINE_CACHE_SIZE": cache_size}
    args = ["--model", IMAGE_A, "--model", IMAGE_B, "--api-key", KEY]
    with werk_serve(home, None, args, env=extra) as server:
        yield server


@pytest.fixture(scope="module")
def served(media_home: Path) -> Iterator[WerkServer]:
    yield from _serve(media_home)


def test_residency_is_unavailable_until_the_first_request_starts_the_worker(
    served: WerkServer,
) -> None:
    before = residency(served, IMAGE_A)
    assert before["status"] == "unavailable"
    assert "first media request starts one" in before["reason"]
    assert generate(served).status_code == 200
    after = residency(served, IMAGE_A)
    assert after["status"] == "supported"
    assert after["reason"].startswith("its pipeline is resident")


def test_an_image_is_a_valid_png_and_the_same_seed_gives_the_same_bytes(
    served: WerkServer,
) -> None:
    first, image = png_of(generate(served, seed=1))
    assert (image.format, image.size, image.mode) == ("PNG", (64, 64), "RGB")
    again, _ = png_of(generate(served, seed=1))
    assert again == first
    other, _ = png_of(generate(served, seed=2))
    assert other != first
    _, wide_image = png_of(generate(served, size="96x64", seed=1))
    assert wide_image.size == (96, 64)


@pytest.mark.parametrize(
    ("fields", "status", "fragment"),
    [
        ({"size": "65x64"}, 400, "multiples of 8"),
        ({"size": "2048x2048"}, 400, "multiples of 8 in 8..1024"),
        ({"steps": 0}, 400, "steps"),
        ({"n": 5}, 400, "n"),
        ({"prompt": "x" * 4001}, 400, "prompt"),
        ({"quality": "hd"}, 400, "quality"),
        ({"response_format": "url"}, 501, "stored outputs"),
    ],
)
def test_out_of_bounds_requests_are_refused_with_typed_errors(
    served: WerkServer, fields: dict[str, object], status: int, fragment: str
) -> None:
    response = generate(served, **fields)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]


def test_a_chat_request_to_an_image_model_is_unsupported(served: WerkServer) -> None:
    body = {"model": IMAGE_A, "messages": [{"role": "user", "content": "hi"}]}
    with served.client(KEY) as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 501, response.text
    assert "does not serve /v1/chat/completions" in response.json()["error"]["message"]


def test_a_worker_killed_mid_generation_fails_the_request_and_the_next_starts_cold(
    served: WerkServer,
) -> None:
    assert generate(served).status_code == 200
    (worker,) = workers()
    outcome: dict[str, httpx.Response] = {}

    def slow() -> None:  # 512x512 with 100 steps: seconds of work to interrupt
        outcome["response"] = generate(served, size="512x512", steps=100)

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(1.5)
    worker.send_signal(signal.SIGKILL)
    thread.join(timeout=120)
    response = outcome["response"]
    assert response.status_code == 502, response.text
    error = response.json()["error"]
    assert error["code"] == "backend_error"
    assert "the media worker exited during execute" in error["message"]
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not psutil.pid_exists(worker.pid)  # reaped by werk serve, not left a zombie
    again = generate(served)
    assert again.status_code == 200, again.text
    (fresh,) = workers()
    assert fresh.pid != worker.pid


def _lru(home: Path, cache_size: str) -> tuple[str, str]:
    """Generate with A, then B; the reasons of A's and B's residency rows afterwards."""
    for server in _serve(home, cache_size):
        assert generate(server, IMAGE_A).status_code == 200
        assert generate(server, IMAGE_B).status_code == 200
        return residency(server, IMAGE_A)["reason"], residency(server, IMAGE_B)["reason"]
    raise AssertionError("werk serve did not start")


def test_with_one_pipeline_slot_alternating_models_evict_each_other(media_home: Path) -> None:
    a, b = _lru(media_home, "1")
    assert a.startswith("its pipeline is not loaded now")
    assert b.startswith("its pipeline is resident")
    assert "keeps 1 of at most 1 pipeline(s)" in b


def test_with_two_pipeline_slots_both_stay_resident(media_home: Path) -> None:
    a, b = _lru(media_home, "2")
    assert a.startswith("its pipeline is resident") and b.startswith("its pipeline is resident")
    assert "keeps 2 of at most 2 pipeline(s)" in b


def test_sigkill_of_werk_serve_leaves_no_media_worker(served: WerkServer) -> None:
    assert generate(served).status_code == 200
    pids = {w.pid for w in workers()}
    assert pids
    served.process.send_signal(signal.SIGKILL)
    served.process.wait()
    deadline = time.monotonic() + 30
    while [w for w in workers() if w.pid in pids] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [w for w in workers() if w.pid in pids] == []
