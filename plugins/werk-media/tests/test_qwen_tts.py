"""Backend ``qwen-tts``: the real qwen-tts 0.1.1 (its own managed environment, Transformers
4.57.3) behind a real ``werk serve``, on a tiny random Qwen3-TTS model made by
``werk models create-demo --kind qwen-tts``.

A 24 kHz WAV that ``wave`` parses, not silent, the same bytes for the same seed; a worker
separate from the generic media worker, in the qwen-tts environment, with its own LRU
(``WERK_MEDIA_PIPELINE_CACHE_SIZE`` applies to each worker independently); voices are the
model's speakers (others are ``400``); the residency row says why voice cloning is unsupported
(no route takes reference audio, torchaudio does not load beside the CPU torch); an async
speech job; and a Qwen3-TTS model imported for backend ``media`` is refused with the backend to
use.
"""

from __future__ import annotations

import io
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from media_testing import KEY, QWEN, TTS, require_backends, residency, werk, workers

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

WRONG = "qwen-as-media"


@pytest.fixture(scope="module")
def qwen_home(media_home: Path) -> Path:
    """The media home plus the tiny Qwen3-TTS demo, and the same files imported (wrongly) for
    backend ``media``."""
    made = werk(media_home, "models", "create-demo", "--kind", "qwen-tts", "--id", QWEN)
    assert made.returncode == 0, made.stderr
    files = media_home / "models" / "files" / QWEN
    wrong = werk(media_home, "models", "import", str(files), "--id", WRONG, "--backend", "media")
    assert wrong.returncode == 0, wrong.stderr
    return media_home


@pytest.fixture(scope="module")
def served(qwen_home: Path) -> Iterator[WerkServer]:
    extra = {"WERK_BACKENDS_DIR": require_backends(), "WERK_MEDIA_PIPELINE_CACHE_SIZE": "1"}
    models = [arg for model in (QWEN, TTS, WRONG) for arg in ("--model", model)]
    # --no-preload: the tests show residency before and after the first request
    args = [*models, "--api-key", KEY, "--no-preload"]
    with werk_serve(qwen_home, None, args, env=extra) as server:
        yield server


def _speech(server: WerkServer, **fields: Any) -> Any:
    body: dict[str, Any] = {"model": QWEN, "input": "Hello from Werk.", "seed": 1, **fields}
    with server.client(KEY, timeout=600) as http:
        return http.post("/v1/audio/speech", json=body)


def _wav(content: bytes) -> tuple[int, int, bytes]:
    with wave.open(io.BytesIO(content), "rb") as parsed:
        assert (parsed.getnchannels(), parsed.getsampwidth()) == (1, 2)
        return parsed.getframerate(), parsed.getnframes(), parsed.readframes(parsed.getnframes())


def test_speech_is_a_24khz_wav_reproducible_for_a_seed(served: WerkServer) -> None:
    before = residency(served, QWEN, "qwen-tts")
    assert before["status"] == "supported" and before["operations"] == ["load"]
    assert "the first qwen-tts request starts one" in before["reason"]
    first = _speech(served)
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "audio/wav"
    rate, frames, pcm = _wav(first.content)
    assert rate == 24000 and frames > 0
    assert any(pcm[i : i + 2] != b"\x00\x00" for i in range(0, len(pcm), 2))  # not silence
    assert _speech(served).content == first.content
    spoken = _speech(served, voice="tiny", instructions="Speak slowly.")
    assert spoken.status_code == 200, spoken.text


def test_the_qwen_worker_is_its_own_process_in_its_own_environment(
    served: WerkServer, qwen_home: Path
) -> None:
    assert _speech(served).status_code == 200
    (qwen,) = workers(qwen_home, "qwen-tts")
    assert "/qwen-tts/venv/bin/python" in qwen.cmdline()[0]
    with served.client(KEY, timeout=600) as http:
        vits = http.post("/v1/audio/speech", json={"model": TTS, "input": "hi", "seed": 1})
    assert vits.status_code == 200, vits.text
    (media,) = workers(qwen_home, "media")
    assert "/media/venv/bin/python" in media.cmdline()[0]
    # Cache size 1 in each worker, independently: both models stay resident.
    row = residency(served, QWEN, "qwen-tts")
    assert row["status"] == "supported"
    assert row["reason"].startswith("its pipeline is resident; the qwen-tts worker")
    assert "voice cloning unsupported: no Werk route takes reference audio" in row["reason"]
    assert "torchaudio" in row["reason"]
    assert residency(served, TTS)["reason"].startswith("its pipeline is resident")


def test_voices_are_the_model_speakers(served: WerkServer) -> None:
    refused = _speech(served, voice="alloy")
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "voice 'alloy' is not one of this model's speakers: ['tiny']"
    )
    assert _speech(served, speed=2.0).status_code == 400
    assert _speech(served).status_code == 200  # a new worker answers after the refusals


def test_an_async_qwen_speech_job_completes_with_the_same_audio(served: WerkServer) -> None:
    with served.client(KEY, timeout=600) as http:
        direct = _speech(served)
        accepted = http.post(
            "/v1/audio/speech", json={"model": QWEN, "input": "Hello from Werk.", "seed": 1,
                                      "async": True},
        )  # fmt: skip
        assert accepted.status_code == 202, accepted.text
        job_id = accepted.json()["id"]
        for _ in range(600):
            record = http.get(f"/v1/jobs/{job_id}").json()
            if record["status"] in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.2)
        assert record["status"] == "completed", record
        audio = http.get(record["output"]["url"])
    assert audio.status_code == 200 and audio.content == direct.content


def test_a_qwen_model_imported_for_media_names_the_backend_to_use(served: WerkServer) -> None:
    answer = _speech(served, model=WRONG)
    assert answer.status_code == 400, answer.text
    assert "is served by backend 'qwen-tts', not 'media'" in answer.json()["error"]["message"]
