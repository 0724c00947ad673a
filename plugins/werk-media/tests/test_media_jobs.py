"""Durable media jobs through a real ``werk serve`` and the real media worker.

``"async": true`` on ``/v1/audio/speech`` answers ``202`` with a queued job that runs to
``completed`` with a downloadable WAV; jobs are private to their API key; ``DELETE`` cancels a
queued job; a ``werk serve`` SIGKILLed mid-job leaves a record that the next server marks
``failed`` ("interrupted by a server restart") while a finished job and its output stay intact.
"""

from __future__ import annotations

import io
import signal
import time
import wave
from pathlib import Path
from typing import Any

import httpx
import pytest
from media_testing import IMAGE_A, KEY, TTS, require_backends

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

OTHER_KEY = "media-key-other-987654321"
SLOW_IMAGE = {"model": IMAGE_A, "prompt": "slow", "size": "128x128", "steps": 60, "seed": 1}
"""About 6 s of work on two idle cores: caught running, yet quick to wait for."""


def _server(home: Path, **env: str) -> Any:
    extra = {"WERK_BACKENDS_DIR": require_backends(), **env}
    args = ["--model", TTS, "--model", IMAGE_A, "--api-key", KEY, "--api-key", OTHER_KEY]
    return werk_serve(home, None, args, env=extra)


def _post(server: WerkServer, path: str, body: dict[str, Any], key: str = KEY) -> Any:
    with server.client(key, timeout=600) as http:
        return http.post(path, json=body)


def _get(server: WerkServer, path: str, key: str = KEY) -> Any:
    with server.client(key, timeout=60) as http:
        return http.get(path)


def _wait(server: WerkServer, job_id: str, *statuses: str, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        record = _get(server, f"/v1/jobs/{job_id}").json()
        if record["status"] in statuses:
            return record
        assert time.monotonic() < deadline, record
        time.sleep(0.2)


def test_an_async_speech_job_runs_to_a_downloadable_wav_private_to_its_key(
    media_home: Path,
) -> None:
    with _server(media_home) as server:
        accepted = _post(server, "/v1/audio/speech", {"model": TTS, "input": "hi", "async": True})
        assert accepted.status_code == 202, accepted.text
        job = accepted.json()
        assert job["status"] == "queued" and job["kind"] == "audio.speech"
        assert "async" not in job["request"]
        done = _wait(server, job["id"], "completed", "failed")
        assert done["status"] == "completed", done
        output = done["output"]
        path = f"/v1/outputs/{output['id']}"
        assert output["url"].startswith(f"{server.base_url}{path}?principal=")  # a signed link
        assert output["content_type"] == "audio/wav"
        audio = _get(server, output["url"])
        assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"
        assert len(audio.content) == output["bytes"]
        with wave.open(io.BytesIO(audio.content), "rb") as parsed:
            assert parsed.getnframes() > 0
        assert _get(server, f"/werk/v1/jobs/{job['id']}").json()["status"] == "completed"
        # Another API key sees none of it.
        assert _get(server, f"/v1/jobs/{job['id']}", OTHER_KEY).status_code == 404
        assert _get(server, path, OTHER_KEY).status_code == 404
        assert _get(server, f"/werk/v1/jobs/{job['id']}", OTHER_KEY).status_code == 404
        assert _get(server, "/v1/jobs", OTHER_KEY).json()["data"] == []


def test_delete_cancels_a_queued_job(media_home: Path) -> None:
    with _server(media_home) as server:
        slow = _post(server, "/v1/jobs", {"kind": "images.generations", "request": SLOW_IMAGE})
        assert slow.status_code == 202, slow.text
        queued = _post(server, "/v1/audio/speech", {"model": TTS, "input": "x", "async": True})
        with server.client(KEY) as http:
            cancelled = http.delete(f"/v1/jobs/{queued.json()['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        image = _wait(server, slow.json()["id"], "completed", "failed")
        assert image["status"] == "completed" and image["output"]["content_type"] == "image/png"
        assert _get(server, f"/v1/jobs/{queued.json()['id']}").json()["status"] == "cancelled"
        # The listing in pages of one, oldest first: together exactly the full listing.
        full = _get(server, "/v1/jobs").json()
        assert full["has_more"] is False and full["next_cursor"] is None
        paged, cursor = [], None
        while True:
            query = "?limit=1" + (f"&cursor={cursor}" if cursor else "")
            page = _get(server, f"/v1/jobs{query}").json()
            paged += [job["id"] for job in page["data"]]
            cursor = page["next_cursor"]
            assert page["has_more"] is (cursor is not None)
            if cursor is None:
                break
        assert paged == [job["id"] for job in full["data"]] and len(paged) >= 2
        assert _get(server, "/v1/jobs?limit=0").status_code == 400
        assert _get(server, "/v1/jobs?cursor=bogus").status_code == 400


def test_a_restart_fails_the_interrupted_job_and_keeps_the_finished_one(
    media_home: Path,
) -> None:
    with _server(media_home) as server:
        first = _post(server, "/v1/audio/speech", {"model": TTS, "input": "kept", "async": True})
        finished = _wait(server, first.json()["id"], "completed")
        slow = _post(server, "/v1/jobs", {"kind": "images.generations", "request": SLOW_IMAGE})
        _wait(server, slow.json()["id"], "running")
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
    with _server(media_home) as again:
        interrupted = _get(again, f"/v1/jobs/{slow.json()['id']}").json()
        assert interrupted["status"] == "failed"
        assert interrupted["error"] == {
            "code": "interrupted",
            "message": "interrupted by a server restart",
        }
        kept = _get(again, f"/v1/jobs/{finished['id']}").json()
        link = finished["output"].pop("url")
        assert kept["output"].pop("url").startswith(again.base_url)
        assert kept == finished
        # The link signed before the restart still opens the output, without a key.
        moved = link.replace(server.base_url, again.base_url)
        with httpx.Client(timeout=60) as browser:
            audio = browser.get(moved)
        assert audio.status_code == 200 and len(audio.content) == finished["output"]["bytes"]


def test_an_abandoned_direct_image_request_frees_the_worker(media_home: Path) -> None:
    """A direct request whose client gave up is cancelled: its worker is stopped, and the next
    small request starts a fresh one instead of waiting minutes behind the abandoned work."""
    endless = {"model": IMAGE_A, "prompt": "slow", "size": "512x512", "steps": 100, "seed": 1}
    small = {"model": IMAGE_A, "prompt": "a dot", "size": "64x64", "steps": 2, "seed": 1}
    with _server(media_home) as server:
        assert _post(server, "/v1/images/generations", small).status_code == 200  # warm
        with server.client(KEY, timeout=2) as http, pytest.raises(httpx.ReadTimeout):
            http.post("/v1/images/generations", json=endless)
        started = time.monotonic()
        answer = _post(server, "/v1/images/generations", small)
        took = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        assert took < 30, f"the next request waited {took:.1f} s"  # not ~160 s behind it


def test_requests_beyond_the_wait_bound_are_refused_with_retry_after(media_home: Path) -> None:
    """One request runs, ``WERK_MEDIA_MAX_WAITING`` (here 1) wait in order, one more is ``429``
    with ``Retry-After`` at once; the long wait is logged; once the slow request is abandoned
    the waiting one answers."""
    import threading

    slow = {"model": IMAGE_A, "prompt": "slow", "size": "512x512", "steps": 100, "seed": 1}
    small = {"model": IMAGE_A, "prompt": "a dot", "size": "64x64", "steps": 2, "seed": 1}
    with _server(media_home, WERK_MEDIA_MAX_WAITING="1") as server:
        assert _post(server, "/v1/images/generations", small).status_code == 200  # warm
        outcome: dict[str, Any] = {}

        def abandoned() -> None:
            with server.client(KEY, timeout=6) as http, pytest.raises(httpx.ReadTimeout):
                http.post("/v1/images/generations", json=slow)

        def waiting() -> None:
            outcome["waiting"] = _post(server, "/v1/images/generations", small)

        first = threading.Thread(target=abandoned)
        first.start()
        time.sleep(1.0)  # the slow one holds the worker
        second = threading.Thread(target=waiting)
        second.start()
        time.sleep(1.0)  # the small one waits behind it
        refused = _post(server, "/v1/images/generations", small)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert (
            error["code"] == "resource_exhausted" and "WERK_MEDIA_MAX_WAITING=1" in error["message"]
        )
        assert int(refused.headers["retry-after"]) >= 1
        first.join(timeout=60)
        second.join(timeout=120)
        assert outcome["waiting"].status_code == 200, outcome["waiting"].text
        assert "waited" in server.log() and "for the media worker" in server.log()
