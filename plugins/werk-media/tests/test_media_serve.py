"""The real media worker (torch + Diffusers, managed environment) behind a real ``werk serve``:
``POST /v1/images/generations`` on tiny generated Stable Diffusion pipelines.

Valid, reproducible PNGs (decoded by Pillow); bounds refused before any backend runs; the
residency row before and after the worker starts; a worker killed mid-generation (typed error,
reaped, the next request starts a cold one); the pipeline LRU with
``WERK_MEDIA_PIPELINE_CACHE_SIZE`` 1 and 2; and no worker left when ``werk serve`` is
SIGKILLed.
"""

from __future__ import annotations

import io
import re
import signal
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest
from media_testing import (
    ASR,
    CLASSIFY,
    IMAGE_A,
    IMAGE_B,
    KEY,
    TTS,
    generate,
    png_of,
    require_backends,
    residency,
    workers,
)
from PIL import Image

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

OTHER_KEY = "media-key-other-0123456789"


def _serve(home: Path, cache_size: str = "1") -> Iterator[WerkServer]:
    extra = {"WERK_BACKENDS_DIR": require_backends(), "WERK_MEDIA_PIPELINE_CACHE_SIZE": cache_size}
    models = [arg for model in (IMAGE_A, IMAGE_B, TTS, ASR, CLASSIFY) for arg in ("--model", model)]
    args = [*models, "--api-key", KEY, "--api-key", OTHER_KEY]
    # --no-preload: these tests show residency before and after the first request
    with werk_serve(home, None, [*args, "--no-preload"], env=extra) as server:
        yield server


@pytest.fixture(scope="module")
def served(media_home: Path) -> Iterator[WerkServer]:
    yield from _serve(media_home)


def test_load_starts_the_worker_before_any_request(served: WerkServer) -> None:
    before = residency(served, IMAGE_A)
    assert before["status"] == "supported" and before["operations"] == ["load"]
    assert "no media worker is running" in before["reason"]
    with served.client(KEY, timeout=300) as http:
        loaded = http.post(f"/werk/v1/models/{IMAGE_A}/load", json={"dry_run": False})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json() == {"model": IMAGE_A, "resident": True}
        [runtime] = [r for r in http.get("/werk/v1/runtimes").json()["runtimes"]]
        assert runtime["model"] == IMAGE_A and runtime["backend"] == "media"
    assert "media worker (pid" in residency(served, IMAGE_A)["reason"]
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
    ],
)
def test_out_of_bounds_requests_are_refused_with_typed_errors(
    served: WerkServer, fields: dict[str, object], status: int, fragment: str
) -> None:
    response = generate(served, **fields)
    assert response.status_code == status, response.text
    assert fragment in response.json()["error"]["message"]


def test_response_format_url_stores_each_image_as_a_private_output(served: WerkServer) -> None:
    """Each image is kept as a finished job's output and answered as an absolute, signed,
    expiring link a browser can open without a header; the bare path needs the owner's key."""
    inline, _ = png_of(generate(served, seed=5))
    (single,) = generate(served, seed=5, response_format="url").json()["data"]
    answer = generate(served, seed=5, n=2, response_format="url")
    assert answer.status_code == 200, answer.text
    urls = [item["url"] for item in answer.json()["data"]]
    paths = [urlsplit(u).path for u in urls]
    assert len(urls) == 2 and all(u.startswith(f"{served.base_url}/v1/outputs/out_") for u in urls)
    with httpx.Client(timeout=60) as browser:  # no Authorization header at all
        stored = browser.get(single["url"])
        assert stored.status_code == 200 and stored.headers["content-type"] == "image/png"
        assert stored.content == inline  # the same request and seed: the same bytes
        assert all(browser.get(url).content.startswith(b"\x89PNG") for url in urls)
        moved = browser.get(urls[0].replace(paths[0], paths[1]))  # the link names one output
        assert moved.status_code == 401, moved.text
    with served.client(KEY, timeout=60) as http:
        assert http.get(paths[0]).content.startswith(b"\x89PNG")  # the key still works
        jobs = http.get("/v1/jobs").json()["data"]
        listed = {urlsplit(j["output"]["url"]).path for j in jobs if j["output"]}
        assert set(paths) <= listed  # kept as finished jobs: retention and `werk cache` apply
    with served.client(OTHER_KEY, timeout=60) as other:
        assert other.get(paths[0]).status_code == 404
    with served.client(timeout=60) as anonymous:
        assert anonymous.get(paths[0]).status_code == 401


def _edit(server: WerkServer, image: bytes, **fields: str) -> httpx.Response:
    form = {"model": IMAGE_A, "prompt": "a blue cat", "size": "64x64", "seed": "7", **fields}
    with server.client(KEY, timeout=600) as http:
        return http.post(
            "/v1/images/edits", data=form, files={"image": ("in.png", image, "image/png")}
        )


def test_an_image_edit_starts_from_the_upload_and_is_reproducible(served: WerkServer) -> None:
    source, _ = png_of(generate(served, seed=1))
    edited, image = png_of(_edit(served, source, size="64x48"))
    assert (image.format, image.size) == ("PNG", (64, 48))
    again, _ = png_of(_edit(served, source, size="64x48"))
    assert again == edited
    weaker, _ = png_of(_edit(served, source, size="64x48", strength="0.3"))
    assert weaker != edited
    jpeg = io.BytesIO()
    Image.open(io.BytesIO(source)).save(jpeg, format="JPEG")
    assert _edit(served, jpeg.getvalue()).status_code == 200
    with served.client(KEY, timeout=60) as http:
        pair = [("image", ("a.png", source, "image/png")), ("mask", ("m.png", source, "image/png"))]
        masked = http.post("/v1/images/edits", data={"model": IMAGE_A, "prompt": "x"}, files=pair)
    assert masked.status_code == 501 and "inpainting" in masked.json()["error"]["message"]
    for bad, fragment in (
        (b"GIF89a....", "PNG or JPEG"),
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 40, "not a readable PNG or JPEG"),
    ):
        refused = _edit(served, bad)
        assert refused.status_code == 400 and fragment in refused.json()["error"]["message"]
    assert _edit(served, source, strength="0").status_code == 400
    assert _edit(served, source, steps="many").status_code == 400
    wrong = _edit(served, source, model=TTS)
    assert wrong.status_code == 400 and "needs a text-to-image model" in wrong.text


def _speech(server: WerkServer, **fields: object) -> httpx.Response:
    body = {"model": TTS, "input": "hello there world", "seed": 3, **fields}
    with server.client(KEY, timeout=600) as http:
        return http.post("/v1/audio/speech", json=body)


def _wav(data: bytes) -> tuple[int, int, int, int]:
    with wave.open(io.BytesIO(data), "rb") as audio:
        return audio.getnchannels(), audio.getsampwidth(), audio.getframerate(), audio.getnframes()


def test_speech_is_a_valid_wav_and_reproducible_for_a_seed(served: WerkServer) -> None:
    first = _speech(served)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "audio/wav"
    channels, width, rate, frames = _wav(first.content)
    assert (channels, width, rate) == (1, 2, 16000) and frames > 0
    assert _speech(served).content == first.content
    assert _speech(served, seed=4).content != first.content
    refused = _speech(served, response_format="mp3")
    assert refused.status_code == 501 and "use 'wav'" in refused.json()["error"]["message"]
    wrong = _speech(served, model=ASR)
    assert wrong.status_code == 400
    assert "needs a text-to-speech model" in wrong.json()["error"]["message"]


def _transcribe(server: WerkServer, audio: bytes, **fields: str) -> httpx.Response:
    with server.client(KEY, timeout=600) as http:
        return http.post(
            "/v1/audio/transcriptions",
            data={"model": ASR, **fields},
            files={"file": ("speech.wav", audio, "audio/wav")},
        )


def _silence(seconds: int, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(b"\0\0" * seconds * rate)
    return buffer.getvalue()


def test_a_transcription_of_a_wav_upload_answers_text(served: WerkServer) -> None:
    speech = _speech(served).content
    answer = _transcribe(served, speech)
    assert answer.status_code == 200, answer.text
    text = answer.json()["text"]
    assert isinstance(text, str) and text  # random weights: some text, not meaning
    plain = _transcribe(served, speech, response_format="text")
    assert plain.headers["content-type"].startswith("text/plain") and plain.text == text
    resampled = _transcribe(served, _silence(1, 8000))  # 8 kHz: resampled to the model's 16 kHz
    assert resampled.status_code == 200, resampled.text


def test_transcription_bounds_are_typed_errors(served: WerkServer) -> None:
    not_wav = _transcribe(served, b"not a wav file at all")
    assert not_wav.status_code == 400 and "WAV" in not_wav.json()["error"]["message"]
    too_long = _transcribe(served, _silence(601, 100))
    assert too_long.status_code == 400
    assert "longer than 600 seconds" in too_long.json()["error"]["message"]
    unknown = _transcribe(served, _silence(1, 16000), colour="blue")
    assert unknown.status_code == 400 and "colour" in unknown.json()["error"]["message"]
    with served.client(KEY) as http:
        as_json = http.post("/v1/audio/transcriptions", json={"model": ASR})
        no_file = http.post("/v1/audio/transcriptions", data={"model": ASR}, files={"x": b""})
    assert as_json.status_code == 415
    assert no_file.status_code == 400


def test_classifications_label_each_text_best_first(served: WerkServer) -> None:
    with served.client(KEY, timeout=600) as http:
        one = http.post("/v1/classifications", json={"model": CLASSIFY, "input": "great film"})
        assert one.status_code == 200, one.text
        body = one.json()
        assert (body["object"], body["model"]) == ("list", CLASSIFY)
        ((only,),) = [item["labels"] for item in body["data"]]
        assert only["label"] in ("negative", "positive") and 0.0 <= only["score"] <= 1.0
        many = http.post(
            "/v1/classifications",
            json={"model": CLASSIFY, "input": ["great film", "awful film", "ok"], "top_k": 2},
        ).json()
        assert [item["index"] for item in many["data"]] == [0, 1, 2]
        for item in many["data"]:
            labels = item["labels"]
            assert {label["label"] for label in labels} == {"negative", "positive"}
            assert labels[0]["score"] >= labels[1]["score"]
            assert abs(sum(label["score"] for label in labels) - 1.0) < 1e-4
        refused = [
            {"model": CLASSIFY, "input": []},
            {"model": CLASSIFY, "input": ["x"] * 33},
            {"model": CLASSIFY, "input": "x" * 4001},
            {"model": CLASSIFY, "input": "x", "top_k": 0},
            {"model": CLASSIFY, "input": "x", "labels": ["a"]},
        ]
        for body in refused:
            answer = http.post("/v1/classifications", json=body)
            assert answer.status_code == 400, (body, answer.text)
        wrong = http.post("/v1/classifications", json={"model": TTS, "input": "x"})
        assert wrong.status_code == 400
        assert "needs a text-classification model" in wrong.json()["error"]["message"]


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
    (worker,) = workers(served.home)
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
    after_exit = residency(served, IMAGE_A)
    assert after_exit["status"] == "supported" and after_exit["operations"] == ["load"]
    assert after_exit["reason"].startswith("no media worker is running")
    again = generate(served)
    assert again.status_code == 200, again.text
    (fresh,) = workers(served.home)
    assert fresh.pid != worker.pid


def _lru(home: Path, cache_size: str) -> tuple[str, str]:
    """Generate with A, then B; the reasons of A's and B's residency rows afterwards."""
    for server in _serve(home, cache_size):
        assert generate(server, IMAGE_A).status_code == 200
        assert generate(server, IMAGE_B).status_code == 200
        return residency(server, IMAGE_A)["reason"], residency(server, IMAGE_B)["reason"]
    raise AssertionError("werk serve did not start")


def _resident_bytes(reason: str) -> int:
    found = re.search(r", (\d+) bytes of parameters and buffers", reason)
    assert found, reason
    return int(found.group(1))


def _weight_bytes(home: Path, model: str) -> int:
    return sum(p.stat().st_size for p in (home / "models" / "files" / model).rglob("*.safetensors"))


def test_with_one_pipeline_slot_alternating_models_evict_each_other(media_home: Path) -> None:
    a, b = _lru(media_home, "1")
    assert a.startswith("its pipeline is not loaded now")
    assert b.startswith("its pipeline is resident")
    assert "keeps 1 of at most 1 pipeline(s)" in b
    # The entry's size is its parameters and buffers: the float32 weights on disk, give or
    # take the safetensors headers and buffers that are not saved.
    weights = _weight_bytes(media_home, IMAGE_B)
    assert 0.9 * weights <= _resident_bytes(b) <= 1.1 * weights


def test_with_two_pipeline_slots_both_stay_resident(media_home: Path) -> None:
    a, b = _lru(media_home, "2")
    assert a.startswith("its pipeline is resident") and b.startswith("its pipeline is resident")
    assert "keeps 2 of at most 2 pipeline(s)" in b
    weights = _weight_bytes(media_home, IMAGE_A) + _weight_bytes(media_home, IMAGE_B)
    assert 0.9 * weights <= _resident_bytes(b) <= 1.1 * weights


def test_sigkill_of_werk_serve_leaves_no_media_worker(served: WerkServer) -> None:
    assert generate(served).status_code == 200
    pids = {w.pid for w in workers(served.home)}
    assert pids
    served.process.send_signal(signal.SIGKILL)
    served.process.wait()
    deadline = time.monotonic() + 30
    while [w for w in workers(served.home) if w.pid in pids] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [w for w in workers(served.home) if w.pid in pids] == []
