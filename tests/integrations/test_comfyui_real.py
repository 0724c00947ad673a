"""The node pack inside a real ComfyUI (opt-in: ``COMFYUI_DIR`` is a ComfyUI checkout, e.g. one
fetched from Comfy-Org/ComfyUI; ``COMFYUI_PYTHON`` a Python with its requirements.txt, torch,
torchvision and av; skipped otherwise, saying so — ComfyUI is not on the package index).

ComfyUI runs headless on loopback with the pack in a ``custom_nodes`` folder named by an extra
model-paths file, beside a real ``werk serve``. Through ComfyUI's own API (``POST /prompt``,
``GET /history``): Werk Chat → Werk Prefill → Werk Decode → Preview Any, with a second Preview
Any fed the handoff itself; queued twice (the single-use nodes run again, nothing replays a
spent handoff); Werk Image → SaveImage; Werk Speech → SaveAudio, its progress on ComfyUI's
websocket; a graph linking the handoff into a STRING input is
refused by ComfyUI's validation. The history never holds a handoff token. ComfyUI's own
``comfy_config`` parses the pack's ``pyproject.toml``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys
import time
import uuid
import wave
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from _integration_support import DEMO, IMAGE, KEY, PACK, TTS, one_shot
from PIL import Image

from werk.supervise import free_port
from werk.testing.server import WerkServer as Served

pytestmark = pytest.mark.slow

COMFYUI_DIR = os.environ.get("COMFYUI_DIR", "")
COMFYUI_PYTHON = os.environ.get("COMFYUI_PYTHON", sys.executable)
TOKEN = re.compile(r"wh_[A-Za-z0-9_\-]{8,}")
SYSTEM = "You write short image prompts."


@pytest.fixture(scope="module")
def comfyui(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    if not COMFYUI_DIR:
        pytest.skip("COMFYUI_DIR is not set: the real-ComfyUI run is opt-in (docs/integrations.md)")
    root = tmp_path_factory.mktemp("comfyui")
    for folder in ("custom_nodes", "front", "input", "output", "temp", "user"):
        (root / folder).mkdir()
    (root / "custom_nodes" / "werk-nodes").symlink_to(PACK, target_is_directory=True)
    paths = root / "extra_model_paths.yaml"
    paths.write_text(f"werk:\n  base_path: {root}\n  custom_nodes: custom_nodes\n")
    port = free_port()
    argv = [
        COMFYUI_PYTHON, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
        "--front-end-root", str(root / "front"), "--disable-api-nodes",
        "--extra-model-paths-config", str(paths), "--database-url", "sqlite:///:memory:",
        "--input-directory", str(root / "input"), "--output-directory", str(root / "output"),
        "--temp-directory", str(root / "temp"), "--user-directory", str(root / "user"),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "PYTEST_"))}
    env.update(WERK_URL=served.base_url, WERK_API_KEY=KEY)
    log = (root / "comfyui.log").open("wb")
    process = subprocess.Popen(
        argv, cwd=COMFYUI_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert process.poll() is None, (root / "comfyui.log").read_text()[-5000:]
            try:
                if httpx.get(f"{base}/system_stats", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (root / "comfyui.log").read_text()[-5000:]
            time.sleep(1)
        yield {"base": base, "root": root, "log": root / "comfyui.log"}
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _queue(comfyui: dict[str, Any], graph: dict[str, Any]) -> httpx.Response:
    body = {"prompt": graph, "client_id": uuid.uuid4().hex}
    return httpx.post(f"{comfyui['base']}/prompt", json=body, timeout=30)


def _finished(comfyui: dict[str, Any], graph: dict[str, Any]) -> dict[str, Any]:
    queued = _queue(comfyui, graph)
    assert queued.status_code == 200, queued.text
    prompt_id = queued.json()["prompt_id"]
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        history = httpx.get(f"{comfyui['base']}/history/{prompt_id}", timeout=30).json()
        if prompt_id in history and history[prompt_id].get("status", {}).get("completed"):
            return dict(history[prompt_id])
        if prompt_id in history and history[prompt_id]["status"].get("status_str") == "error":
            pytest.fail(json.dumps(history[prompt_id]["status"])[-4000:])
        time.sleep(0.5)
    pytest.fail(f"prompt {prompt_id} did not finish: {comfyui['log'].read_text()[-4000:]}")


CHAT_GRAPH: dict[str, Any] = {
    "1": {"class_type": "WerkChat",
          "inputs": {"model": DEMO, "system": SYSTEM, "prompt": "A cat on a boat.",
                     "max_tokens": 12, "temperature": 0.0, "seed": 0, "unload_after": False}},
    "2": {"class_type": "WerkPrefill",
          "inputs": {"model": DEMO, "system": "", "prompt": ["1", 0],
                     "allow_experimental": True}},
    "3": {"class_type": "WerkDecode",
          "inputs": {"handoff": ["2", 0], "max_tokens": 10, "temperature": 0.0, "seed": 0,
                     "stop": ""}},
    "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    "5": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
}  # fmt: skip


def test_the_pack_loads_with_its_nodes(comfyui: dict[str, Any], served: Served) -> None:
    info = httpx.get(f"{comfyui['base']}/object_info", timeout=60).json()
    werk = sorted(name for name in info if name.startswith("Werk"))
    assert werk == sorted([
        "WerkChat", "WerkDecode", "WerkImage", "WerkMemory", "WerkNamedState", "WerkPrefill",
        "WerkServer", "WerkSpeech", "WerkUnload",
    ])  # fmt: skip  # no expert nodes without WERK_COMFY_EXPERIMENTAL
    assert info["WerkChat"]["input"]["required"]["model"][0] == [DEMO]
    assert info["WerkImage"]["input"]["required"]["model"][0] == [IMAGE]
    assert info["WerkDecode"]["input"]["required"]["handoff"][0] == "WERK_STATE_HANDOFF"
    assert info["WerkPrefill"]["output"] == ["WERK_STATE_HANDOFF"]
    assert info["WerkChat"]["category"] == "Werk/LLM"


def test_chat_prefill_decode_preview_and_no_token_in_the_history(
    comfyui: dict[str, Any], served: Served
) -> None:
    prompt = one_shot(
        served,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "A cat on a boat."}],
        12,
    )
    expected = one_shot(served, [{"role": "user", "content": prompt}], 10)
    texts = []
    for _ in range(2):  # the second run prefills and decodes again: nothing is replayed
        entry = _finished(comfyui, CHAT_GRAPH)
        outputs = entry["outputs"]
        texts.append(outputs["4"]["text"][0])
        shown = outputs["5"]["text"][0]
        assert "token hidden" in shown and not TOKEN.search(shown)
        assert entry["status"]["status_str"] == "success"
    assert texts == [expected, expected]
    history = httpx.get(f"{comfyui['base']}/history", timeout=30).text
    assert not TOKEN.search(history)
    assert not TOKEN.search(comfyui["log"].read_text(errors="replace"))


def test_a_handoff_cannot_be_linked_into_a_string_input(comfyui: dict[str, Any]) -> None:
    graph = {k: v for k, v in json.loads(json.dumps(CHAT_GRAPH)).items() if k in ("1", "2")}
    graph["6"] = {"class_type": "WerkChat",
                  "inputs": {**graph["1"]["inputs"], "prompt": ["2", 0]}}  # fmt: skip
    graph["7"] = {"class_type": "PreviewAny", "inputs": {"source": ["6", 0]}}
    refused = _queue(comfyui, graph)
    assert refused.status_code == 400, refused.text
    errors = refused.json()["node_errors"]["6"]["errors"]
    assert [e["type"] for e in errors] == ["return_type_mismatch"]
    assert "WERK_STATE_HANDOFF" in errors[0]["details"]


def test_image_to_save_image(comfyui: dict[str, Any]) -> None:
    graph = {
        "1": {"class_type": "WerkImage",
              "inputs": {"model": IMAGE, "prompt": "a red cat", "negative_prompt": "",
                         "width": 64, "height": 64, "steps": 4, "guidance_scale": 7.5,
                         "seed": 5, "count": 2}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                                                    "filename_prefix": "werk"}},
    }  # fmt: skip
    images = _finished(comfyui, graph)["outputs"]["2"]["images"]
    assert len(images) == 2
    for saved in images:
        path = comfyui["root"] / "output" / saved["subfolder"] / saved["filename"]
        with Image.open(path) as image:
            assert image.size == (64, 64)
            metadata = json.dumps(image.info)
        assert "WerkImage" in metadata  # ComfyUI saved the graph into the PNG: without the key
        assert KEY not in metadata


def test_comfyuis_own_parser_reads_the_pyproject() -> None:
    if not COMFYUI_DIR:
        pytest.skip("COMFYUI_DIR is not set: the real-ComfyUI run is opt-in (docs/integrations.md)")
    probe = (
        "from comfy_config import config_parser as p\n"
        f"c = p.extract_node_configuration({str(PACK)!r})\n"
        "print(c.project.name, c.project.version, c.tool_comfy.publisher_id,"
        " c.tool_comfy.display_name, c.project.license.file)\n"
    )
    parsed = subprocess.run(
        [COMFYUI_PYTHON, "-c", probe], cwd=COMFYUI_DIR, capture_output=True, text=True, timeout=120
    )
    assert parsed.returncode == 0, parsed.stderr[-3000:]
    assert parsed.stdout.split() == ["werk-nodes", "0.1.0", "werk", "Werk", "LICENSE"]


def test_speech_job_with_progress_to_save_audio(comfyui: dict[str, Any], served: Served) -> None:
    graph = {
        "1": {"class_type": "WerkSpeech",
              "inputs": {"model": TTS, "text": "Hello from ComfyUI.", "voice": "", "seed": 2}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0],
                                                    "filename_prefix": "audio/werk"}},
    }  # fmt: skip
    client_id = uuid.uuid4().hex
    events: list[dict[str, Any]] = []

    async def run() -> None:
        ws_url = comfyui["base"].replace("http", "ws") + f"/ws?clientId={client_id}"
        async with websockets.connect(ws_url) as ws:
            body = {"prompt": graph, "client_id": client_id}
            async with httpx.AsyncClient() as http:
                queued = await http.post(f"{comfyui['base']}/prompt", json=body, timeout=30)
            assert queued.status_code == 200, queued.text
            prompt_id = queued.json()["prompt_id"]
            while True:
                raw = await asyncio.wait_for(ws.recv(), timeout=600)
                if isinstance(raw, bytes):
                    continue
                event = json.loads(raw)
                events.append(event)
                data = event.get("data", {})
                if event["type"] == "execution_error":
                    pytest.fail(json.dumps(data)[-3000:])
                if (
                    event["type"] == "executing"
                    and data.get("node") is None
                    and data.get("prompt_id") == prompt_id
                ):
                    return

    asyncio.run(run())
    progress = [e["data"] for e in events if e["type"] == "progress" and e["data"]["node"] == "1"]
    assert progress and progress[-1]["value"] == progress[-1]["max"] == 4, progress
    (saved,) = next(e["data"]["output"]["audio"] for e in events if e["type"] == "executed")
    path = comfyui["root"] / "output" / saved["subfolder"] / saved["filename"]
    probe = (
        "import av, sys\n"
        "with av.open(sys.argv[1]) as f:\n"
        "    s = f.streams.audio[0]\n"
        "    n = sum(frame.samples for frame in f.decode(s))\n"
        "    print(s.rate, n)\n"
    )
    decoded = subprocess.run(
        [COMFYUI_PYTHON, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    assert decoded.returncode == 0, decoded.stderr[-3000:]
    rate, samples = map(int, decoded.stdout.split())
    body = {"model": TTS, "input": "Hello from ComfyUI.", "seed": 2}
    with served.client(KEY, timeout=600) as http:
        wav = http.post("/v1/audio/speech", json=body).content
    with wave.open(io.BytesIO(wav)) as reference:
        assert (rate, samples) == (reference.getframerate(), reference.getnframes())
