"""AUTOMATIC1111's ``/sdapi/v1`` through a real ``werk serve`` on the tiny image pipelines (the
real media worker: torch and Diffusers in the managed environment; these tests fail, never
skip, without ``WERK_BACKENDS_DIR``).

Driven by the real ``webuiapi`` 0.9.17 client (HTTP Basic with the API key as the password):
models, selecting one, txt2img (same seed, same image), img2img, progress and interrupt. Then
the request sequences Open WebUI and SillyTavern send, replayed with their headers:

* Open WebUI (``backend/open_webui/routers/images.py``): an ``authorization`` header that is
  empty without configured auth (``get_automatic1111_api_auth``), ``GET /sdapi/v1/options``,
  the whole options dict posted back with another ``sd_model_checkpoint``, ``POST txt2img``
  with ``prompt``, ``batch_size``, ``width``, ``height``, ``steps``, ``cfg_scale``,
  ``sampler_name``, ``scheduler``; it reads ``images`` and ``info``.
* SillyTavern (``src/endpoints/stable-diffusion.js``): ``Authorization: Basic`` of its
  ``user:password`` setting, ``sd-models``, ``options``, ``samplers``, ``schedulers``,
  ``upscalers``, ``latent-upscale-modes``, a txt2img body full of fields Werk ignores
  (``enable_hr``, ``hr_*``, ``restore_faces``, ``override_settings``…), ``progress`` polling and
  ``interrupt`` when its client goes away.

Another key sees neither the first key's selected model nor its progress, and cannot interrupt
it.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import webuiapi
from media_testing import IMAGE_A, IMAGE_B, KEY, require_backends
from PIL import Image

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

OTHER_KEY = "media-other-key-0123456789abcdef"
SMALL = {"width": 64, "height": 64, "steps": 4}


@pytest.fixture(scope="module")
def served(media_home: Path) -> Iterator[WerkServer]:
    args = ["--api-key", KEY, "--api-key", OTHER_KEY]
    with werk_serve(
        media_home, None, args, env={"WERK_BACKENDS_DIR": require_backends()}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def keyless(media_home: Path) -> Iterator[WerkServer]:
    with werk_serve(media_home, None, [], env={"WERK_BACKENDS_DIR": require_backends()}) as server:
        yield server


def _client(server: WerkServer, key: str = KEY) -> webuiapi.WebUIApi:
    port = int(server.base_url.rsplit(":", 1)[1])
    api = webuiapi.WebUIApi(host="127.0.0.1", port=port)
    api.set_auth("werk", key)
    return api


def _titles(server: WerkServer, key: str = KEY) -> dict[str, str]:
    with server.client(key) as http:
        return {m["model_name"]: m["title"] for m in http.get("/sdapi/v1/sd-models").json()}


def _png(encoded: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(encoded)))
    image.load()
    return image


def test_webuiapi_lists_selects_and_generates(served: WerkServer) -> None:
    api = _client(served)
    titles = _titles(served)
    assert sorted(api.util_get_model_names()) == sorted(titles.values())
    assert api.util_get_current_model() == titles[IMAGE_A]
    first = api.txt2img(prompt="a red cat", seed=7, **SMALL)
    again = api.txt2img(prompt="a red cat", seed=7, **SMALL)
    assert first.image.size == (64, 64)
    assert first.info["seed"] == 7 and first.info["all_seeds"] == [7]
    assert first.info["sd_model_name"] == IMAGE_A
    assert first.image.tobytes() == again.image.tobytes()  # same seed, same image
    random = api.txt2img(prompt="a red cat", **SMALL)  # seed -1: a random one, reported
    assert random.info["seed"] != -1 and random.info["all_seeds"] == [random.info["seed"]]
    api.util_set_model(IMAGE_B)
    assert api.util_get_current_model() == titles[IMAGE_B]
    other = api.txt2img(prompt="a red cat", seed=7, batch_size=2, **SMALL)
    assert other.info["sd_model_name"] == IMAGE_B and other.info["all_seeds"] == [7, 8]
    assert len(other.images) == 2 and other.images[0].tobytes() != first.image.tobytes()
    edited = api.img2img(
        images=[first.image], prompt="a blue cat", seed=3, denoising_strength=0.6, **SMALL
    )
    assert edited.image.size == (64, 64)
    assert edited.image.tobytes() != first.image.tobytes()
    api.util_set_model(IMAGE_A)


def test_img2img_takes_a_data_url_and_bounds_are_typed_errors(served: WerkServer) -> None:
    api = _client(served)
    start = api.txt2img(prompt="a red cat", seed=1, **SMALL).image
    buffer = io.BytesIO()
    start.save(buffer, format="PNG")
    data_url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    with served.client(KEY, timeout=600) as http:
        body = {"init_images": [data_url], "prompt": "a blue cat", "seed": 5, **SMALL}
        answer = http.post("/sdapi/v1/img2img", json=body)
        assert answer.status_code == 200, answer.text
        assert _png(answer.json()["images"][0]).size == (64, 64)
        assert json.loads(answer.json()["info"])["all_seeds"] == [5]
        for wrong, field in (
            ({"width": 70}, "width"),
            ({"steps": 500}, "steps"),
            ({"batch_size": 3, "n_iter": 2}, "batch_size"),
        ):
            refused = http.post("/sdapi/v1/txt2img", json={"prompt": "x", **SMALL, **wrong})
            assert refused.status_code == 400, refused.text
            error = refused.json()
            assert set(error) >= {"error", "detail", "body", "errors"}
            assert error["error"] == "invalid_request" and f"'{field}'" in error["detail"]
        junk = http.post("/sdapi/v1/img2img", json={"init_images": ["bm90IGFuIGltYWdl"]})
        assert junk.status_code == 400 and "PNG or JPEG" in junk.json()["detail"]
        unauthenticated = httpx.get(f"{served.base_url}/sdapi/v1/sd-models")
        assert unauthenticated.status_code == 401


def test_progress_and_interrupt_are_per_key(served: WerkServer) -> None:
    api, other = _client(served), _client(served, OTHER_KEY)
    seen: dict[str, Any] = {}

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = api.get_progress()
            if progress["state"]["job_count"]:
                seen["mine"] = progress
                seen["theirs"] = other.get_progress()
                other.interrupt()  # another key's interrupt must not stop mine
                time.sleep(0.5)
                seen["still"] = api.get_progress()["state"]["job_count"]
                seen["interrupt"] = api.interrupt()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    result = api.txt2img(prompt="x", width=256, height=256, steps=40, seed=1, batch_size=4)
    watcher.join()
    assert seen["mine"]["state"]["job_count"] == 4
    assert seen["theirs"]["state"]["job_count"] == 0 and seen["theirs"]["progress"] == 0.0
    assert seen["still"] == 4
    assert seen["interrupt"] == {}
    assert result.info["interrupted"] is True and len(result.images) < 4
    assert api.get_progress()["state"]["job_count"] == 0  # nothing left running
    assert api.txt2img(prompt="a red cat", seed=7, **SMALL).image.size == (64, 64)


def test_the_selected_model_is_per_key(served: WerkServer) -> None:
    titles = _titles(served)
    with served.client(KEY) as mine, served.client(OTHER_KEY) as theirs:
        chosen = mine.post("/sdapi/v1/options", json={"sd_model_checkpoint": titles[IMAGE_B]})
        assert chosen.status_code == 200 and chosen.json() is None
        assert mine.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == titles[IMAGE_B]
        assert theirs.get("/sdapi/v1/options").json()["sd_model_checkpoint"] == titles[IMAGE_A]
        unknown = mine.post("/sdapi/v1/options", json={"sd_model_checkpoint": "nope"})
        assert unknown.status_code == 404
        mine.post("/sdapi/v1/options", json={"sd_model_checkpoint": IMAGE_A})


def test_open_webui_sequence(keyless: WerkServer) -> None:
    """As Open WebUI sends it with no AUTOMATIC1111 auth configured: an empty header."""
    headers = {"authorization": ""}
    url = keyless.base_url
    with httpx.Client(timeout=600) as http:
        models = http.get(f"{url}/sdapi/v1/sd-models", headers=headers).json()
        wanted = next(m["title"] for m in models if m["model_name"] == IMAGE_B)
        options = http.get(f"{url}/sdapi/v1/options", headers=headers).json()
        assert options["sd_model_checkpoint"] != wanted
        options["sd_model_checkpoint"] = wanted
        posted = http.post(f"{url}/sdapi/v1/options", json=options, headers=headers)
        assert posted.status_code == 200, posted.text
        data = {
            "prompt": "a lighthouse at dusk",
            "batch_size": 1,
            "width": 64,
            "height": 64,
            "negative_prompt": "blurry",
            "steps": 4,
            "cfg_scale": 7.0,
            "sampler_name": "Euler a",
            "scheduler": "Karras",
        }
        answer = http.post(f"{url}/sdapi/v1/txt2img", json=data, headers=headers)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert _png(body["images"][0]).size == (64, 64)
        info = json.loads(body["info"])
        assert info["sd_model_name"] == IMAGE_B and info["negative_prompt"] == "blurry"
        assert body["parameters"]["sampler_name"] == "Euler a"  # echoed, as A1111 does
        http.post(f"{url}/sdapi/v1/options", json={"sd_model_checkpoint": IMAGE_A}, headers=headers)


def test_sillytavern_sequence(served: WerkServer) -> None:
    """As SillyTavern's server sends it, Basic auth from its ``user:password`` setting."""
    basic = "Basic " + base64.b64encode(f"sillytavern:{KEY}".encode()).decode()
    headers = {"Authorization": basic, "Content-Type": "application/json"}
    url = served.base_url
    with httpx.Client(timeout=600, headers=headers) as http:
        for path in ("sd-models", "options", "samplers", "schedulers", "upscalers",
                     "latent-upscale-modes"):  # fmt: skip
            assert http.get(f"{url}/sdapi/v1/{path}").status_code == 200, path
        title = next(
            m["title"] for m in http.get(f"{url}/sdapi/v1/sd-models").json()
            if m["model_name"] == IMAGE_A
        )  # fmt: skip
        assert (
            http.post(f"{url}/sdapi/v1/options", json={"sd_model_checkpoint": title}).json() is None
        )
        assert http.get(f"{url}/sdapi/v1/progress").json()["progress"] == 0.0
        body = {
            "prompt": "a castle, masterpiece",
            "negative_prompt": "lowres",
            "sampler_name": "DPM++ 2M",
            "scheduler": "Automatic",
            "steps": 4,
            "cfg_scale": 7,
            "width": 64,
            "height": 64,
            "restore_faces": False,
            "enable_hr": False,
            "hr_upscaler": "Latent",
            "hr_scale": 2,
            "hr_additional_modules": [],
            "denoising_strength": 0.7,
            "hr_second_pass_steps": 0,
            "seed": 42,
            "override_settings": {"CLIP_stop_at_last_layers": 1},
            "override_settings_restore_afterwards": True,
            "clip_skip": 1,
            "save_images": True,
            "send_images": True,
            "do_not_save_grid": False,
            "do_not_save_samples": False,
        }
        answer = http.post(f"{url}/sdapi/v1/txt2img", json=body)
        assert answer.status_code == 200, answer.text
        assert _png(answer.json()["images"][0]).size == (64, 64)
        assert json.loads(answer.json()["info"])["seed"] == 42
        assert http.post(f"{url}/sdapi/v1/interrupt").json() == {}  # its abort: nothing running
