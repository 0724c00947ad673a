"""The ComfyUI-compatible API through a real ``werk serve`` on the tiny image pipelines (the real
media worker; these tests fail, never skip, without ``WERK_BACKENDS_DIR``).

Driven by the real ``comfy-api-simplified`` 1.6.0 client (HTTP Basic with the key as password,
its websocket too): upload an image, queue the text-to-image graph, wait, download the PNGs
through ``/view``; the image-to-image graph on the upload. The websocket's event order; a graph
with a node class Werk does not run is a 400 naming it. Then the sequences Open WebUI
(``backend/open_webui/utils/images/comfyui.py``: websocket first with ``clientId``, ``POST
/prompt`` with that ``client_id``, wait for ``executing {node: null}``, ``GET /history/{id}``,
``GET /view``; models from ``/object_info``) and SillyTavern (``src/endpoints/stable-diffusion.js``:
``/object_info`` for models, samplers and schedulers, ``POST /prompt`` without a client id,
``GET /history`` polled until the prompt appears, ``/view``) send. Another key cannot read the
history, the outputs or the websocket events of the first; the same seed gives the same image.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from comfy_api_simplified import ComfyApiWrapper, ComfyWorkflowWrapper
from media_testing import IMAGE_A, IMAGE_B, KEY, TTS, require_backends
from PIL import Image

from werk.testing.server import WerkServer, werk_serve

pytestmark = pytest.mark.slow

OTHER_KEY = "media-other-key-0123456789abcdef"
TXT2IMG: dict[str, Any] = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": IMAGE_A},
          "_meta": {"title": "Load Checkpoint"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cat", "clip": ["4", 1]},
          "_meta": {"title": "Positive"}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["4", 1]},
          "_meta": {"title": "Negative"}},
    "5": {"class_type": "EmptyLatentImage",
          "inputs": {"width": 64, "height": 64, "batch_size": 2}, "_meta": {"title": "Latent"}},
    "3": {"class_type": "KSampler",
          "inputs": {"model": ["4", 0], "seed": 5, "steps": 4, "cfg": 7.0,
                     "sampler_name": "default", "scheduler": "default", "positive": ["6", 0],
                     "negative": ["7", 0], "latent_image": ["5", 0], "denoise": 1.0},
          "_meta": {"title": "KSampler"}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]},
          "_meta": {"title": "VAE Decode"}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "werk"},
          "_meta": {"title": "Save Image"}},
}  # fmt: skip


def _img2img(upload: str) -> dict[str, Any]:
    graph = copy.deepcopy(TXT2IMG)
    del graph["5"]
    graph["10"] = {"class_type": "LoadImage", "inputs": {"image": upload},
                   "_meta": {"title": "Load Image"}}  # fmt: skip
    graph["11"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["10", 0], "vae": ["4", 2]},
                   "_meta": {"title": "VAE Encode"}}  # fmt: skip
    graph["3"]["inputs"].update(latent_image=["11", 0], denoise=0.6)
    return graph


@pytest.fixture(scope="module")
def served(media_home: Path) -> Iterator[WerkServer]:
    args = ["--api-key", KEY, "--api-key", OTHER_KEY]
    with werk_serve(media_home, None, args, env={"WERK_BACKENDS_DIR": require_backends()}) as s:
        yield s


def _api(server: WerkServer, key: str = KEY) -> ComfyApiWrapper:
    return ComfyApiWrapper(server.base_url, user="comfy", password=key)


def _bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _upload(tmp_path: Path) -> Path:
    path = tmp_path / "start.png"
    Image.new("RGB", (64, 64), (200, 30, 30)).save(path)
    return path


def test_the_client_uploads_queues_waits_and_downloads(served: WerkServer, tmp_path: Path) -> None:
    api = _api(served)
    uploaded = api.upload_image(_upload(tmp_path), subfolder="")
    assert uploaded == {"name": "start.png", "subfolder": "", "type": "input"}
    images = api.queue_and_wait_images(ComfyWorkflowWrapper(TXT2IMG), "Save Image")
    assert len(images) == 2 and all(_png(data).size == (64, 64) for data in images.values())
    edited = api.queue_and_wait_images(ComfyWorkflowWrapper(_img2img("start.png")), "Save Image")
    (first,) = edited.values()  # one image in, one image out
    assert _png(first).size == (64, 64)
    assert first not in images.values()
    again = api.queue_and_wait_images(ComfyWorkflowWrapper(TXT2IMG), "Save Image")
    assert sorted(again.values()) == sorted(images.values())  # same seeds, same images
    assert api.get_queue() == {"queue_running": [], "queue_pending": []}
    info = api.get_object_info("CheckpointLoaderSimple")
    choices = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    assert choices == sorted([IMAGE_A, IMAGE_B])
    assert api.get_system_stats()["system"]["ram_total"] > 0


def test_the_websocket_reports_in_comfyui_order(served: WerkServer) -> None:
    client_id = uuid.uuid4().hex
    url = served.base_url.replace("http://", "ws://") + f"/ws?clientId={client_id}"

    async def run() -> list[dict[str, Any]]:
        async with websockets.connect(url, additional_headers=_bearer()) as socket:
            messages = [json.loads(await socket.recv())]
            async with httpx.AsyncClient(timeout=600, headers=_bearer()) as http:
                queued = await http.post(
                    f"{served.base_url}/api/prompt",
                    json={"prompt": TXT2IMG, "client_id": client_id},
                )
                assert queued.status_code == 200, queued.text
            while True:
                message = json.loads(await asyncio.wait_for(socket.recv(), 300))
                messages.append(message)
                if message["type"] == "executing" and message["data"]["node"] is None:
                    return messages

    messages = asyncio.run(run())
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "status" and messages[0]["data"]["sid"] == client_id
    assert kinds[1:3] == ["execution_start", "execution_cached"]
    assert kinds[-2:] == ["execution_success", "executing"]
    assert kinds.count("progress") == 2 and kinds.count("executed") == 1
    executed = next(m for m in messages if m["type"] == "executed")["data"]
    assert executed["node"] == "9" and len(executed["output"]["images"]) == 2
    assert kinds.index("executed") > max(i for i, k in enumerate(kinds) if k == "progress")


def test_graphs_werk_does_not_run_are_refused_naming_the_node(served: WerkServer) -> None:
    with served.client(KEY) as http:
        lora = copy.deepcopy(TXT2IMG)
        lora["12"] = {"class_type": "LoraLoader", "inputs": {"model": ["4", 0]}}
        refused = http.post("/prompt", json={"prompt": lora})
        assert refused.status_code == 400, refused.text
        assert "LoraLoader" in json.dumps(refused.json()["node_errors"]["12"])
        unknown = copy.deepcopy(TXT2IMG)
        unknown["4"]["inputs"]["ckpt_name"] = "sd_xl_base_1.0.safetensors"
        refused = http.post("/prompt", json={"prompt": unknown})
        assert refused.status_code == 400
        body = refused.json()
        assert body["error"]["type"] == "prompt_outputs_failed_validation"
        assert body["node_errors"]["4"]["class_type"] == "CheckpointLoaderSimple"
        no_output = {k: v for k, v in TXT2IMG.items() if k != "9"}
        assert http.post("/prompt", json={"prompt": no_output}).json()["error"]["type"] == (
            "prompt_no_outputs"
        )
        too_big = copy.deepcopy(TXT2IMG)
        too_big["5"]["inputs"]["width"] = 4096
        assert "'width'" in json.dumps(http.post("/prompt", json={"prompt": too_big}).json())


def test_another_key_sees_nothing_of_a_prompt(served: WerkServer) -> None:
    client_id = uuid.uuid4().hex
    ws = served.base_url.replace("http://", "ws://") + f"/ws?clientId={client_id}"

    async def run() -> tuple[str, list[str]]:
        async with websockets.connect(ws, additional_headers=_bearer(OTHER_KEY)) as theirs:
            await theirs.recv()  # their status
            async with httpx.AsyncClient(timeout=600, headers=_bearer()) as http:
                queued = await http.post(
                    f"{served.base_url}/prompt", json={"prompt": TXT2IMG, "client_id": client_id}
                )
                prompt_id = queued.json()["prompt_id"]
                while not (await http.get(f"{served.base_url}/history/{prompt_id}")).json():
                    await asyncio.sleep(0.1)
            seen = []
            try:
                while True:
                    seen.append(json.loads(await asyncio.wait_for(theirs.recv(), 1.0))["type"])
            except TimeoutError:
                return prompt_id, seen

    prompt_id, seen = asyncio.run(run())
    assert seen == []  # the same clientId under another key gets no event
    with served.client(KEY) as mine, served.client(OTHER_KEY) as theirs:
        history = mine.get(f"/history/{prompt_id}").json()[prompt_id]
        assert history["status"]["completed"] is True
        image = history["outputs"]["9"]["images"][0]
        assert theirs.get(f"/history/{prompt_id}").json() == {}
        assert prompt_id not in theirs.get("/api/history").json()
        params = {"filename": image["filename"], "subfolder": "", "type": "output"}
        assert mine.get("/view", params=params).status_code == 200
        assert theirs.get("/view", params=params).status_code == 404
        assert httpx.get(f"{served.base_url}/history").status_code == 401


def test_open_webui_sequence(served: WerkServer) -> None:
    """Open WebUI's ComfyUI engine: models from /object_info, the websocket opened first, then
    the prompt with that client id, history and /view (Bearer: its ComfyUI API key)."""
    base = served.base_url
    with httpx.Client(timeout=600, headers=_bearer()) as http:
        info = http.get(f"{base}/object_info").json()
        models = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
        graph = copy.deepcopy(TXT2IMG)
        graph["4"]["inputs"]["ckpt_name"] = models[-1]
        graph["5"]["inputs"]["batch_size"] = 1
        client_id = str(uuid.uuid4())

        async def run() -> str:
            ws = base.replace("http://", "ws://") + f"/ws?clientId={client_id}"
            async with websockets.connect(ws, additional_headers=_bearer()) as socket:
                queued = http.post(f"{base}/prompt", json={"prompt": graph, "client_id": client_id})
                prompt_id = str(queued.json()["prompt_id"])
                while True:
                    message = json.loads(await asyncio.wait_for(socket.recv(), 300))
                    data = message.get("data", {})
                    done = message["type"] == "executing" and data.get("node") is None
                    if done and data.get("prompt_id") == prompt_id:
                        return prompt_id

        prompt_id = asyncio.run(run())
        outputs = http.get(f"{base}/history/{prompt_id}").json()[prompt_id]["outputs"]
        for output in outputs.values():
            for image in output["images"]:
                viewed = http.get(f"{base}/view", params=image)
                assert viewed.status_code == 200 and _png(viewed.content).size == (64, 64)


@pytest.fixture(scope="module")
def keyless(media_home: Path) -> Iterator[WerkServer]:
    with werk_serve(media_home, None, [], env={"WERK_BACKENDS_DIR": require_backends()}) as s:
        yield s


def test_sillytavern_sequence(keyless: WerkServer) -> None:
    """SillyTavern's server (``src/endpoints/stable-diffusion.js``, its ComfyUI part): no
    Authorization header (only its interrupt sends Basic), ``/system_stats`` as a ping,
    ``/object_info`` read for samplers, schedulers and ``CheckpointLoaderSimple`` /
    ``UNETLoader`` model choices, ``POST /prompt`` with the JSON as a bare string body (no
    Content-Type), ``GET /history`` polled every 100 ms until the prompt appears, then ``/view``;
    on abort ``POST /interrupt`` with Basic auth."""
    base = keyless.base_url
    with httpx.Client(timeout=600) as http:
        assert http.get(f"{base}/system_stats").status_code == 200
        info = http.get(f"{base}/object_info").json()
        assert info["KSampler"]["input"]["required"]["sampler_name"][0]
        assert info["KSampler"]["input"]["required"]["scheduler"][0]
        ckpts = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
        assert IMAGE_A in ckpts and info["UNETLoader"]["input"]["required"]["unet_name"][0] == []
        graph = copy.deepcopy(TXT2IMG)
        graph["5"]["inputs"]["batch_size"] = 1
        queued = http.post(f"{base}/prompt", content=json.dumps({"prompt": graph}).encode())
        assert queued.status_code == 200, queued.text
        prompt_id = queued.json()["prompt_id"]
        deadline = time.monotonic() + 300
        while prompt_id not in (history := http.get(f"{base}/history").json()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        entry = history[prompt_id]
        assert entry["status"]["status_str"] == "success"
        (image,) = entry["outputs"]["9"]["images"]
        viewed = http.get(f"{base}/view", params=image)
        assert _png(viewed.content).size == (64, 64)
        basic = "Basic " + base64.b64encode(b"user:pass").decode()
        interrupted = http.post(f"{base}/interrupt", headers={"Authorization": basic})
        assert interrupted.status_code == 200  # its abort: nothing running


def test_the_speech_graph_runs_as_a_job_and_saves_a_wav(served: WerkServer) -> None:
    graph = {
        "1": {"class_type": "WerkTextToSpeech",
              "inputs": {"model": TTS, "text": "Hello from Werk.", "voice": "", "seed": 3},
              "_meta": {"title": "Speech"}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "a"},
              "_meta": {"title": "Save Audio"}},
    }  # fmt: skip
    api = _api(served)
    info = api.get_object_info("WerkTextToSpeech")["WerkTextToSpeech"]
    assert TTS in info["input"]["required"]["model"][0]
    saved = [api.queue_and_wait_images(ComfyWorkflowWrapper(graph), "Save Audio")
             for _ in range(2)]  # fmt: skip
    (first,) = saved[0].values()
    assert first.startswith(b"RIFF") and first[8:12] == b"WAVE"
    assert list(saved[1].values()) == [first]  # the same seed, the same audio
    with served.client(KEY) as http:
        jobs = http.get("/v1/jobs").json()["data"]
        assert any(job["kind"] == "audio.speech" for job in jobs)  # it ran as a Werk job
