"""Every Werk node's function against a real ``werk serve`` with the demo models: the llama.cpp
demo (a real ``llama-server``), a tiny Diffusers pipeline and a tiny VITS speech model (the real
media worker). The nodes run as ComfyUI runs them: the class from ``NODE_CLASS_MAPPINGS``, its
``FUNCTION`` called with the inputs as keyword arguments, the API key read by a Werk Server node
from an environment variable."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import threading
import wave
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import werk_comfy
from _integration_support import DEMO, IMAGE, KEY, KEY_VARIABLE, OTHER_KEY, PACK, TTS, one_shot
from werk_comfy.client import WerkNodeError, WerkServer
from werk_comfy.handoff import WerkStateHandoff
from werk_comfy.system import ALL

from werk.testing.server import WerkServer as Served
from werk.testing.server import server_env

pytestmark = pytest.mark.slow

NODES, _ = werk_comfy.node_mappings(experimental=True)
SYSTEM = "You are terse."
PROMPT = "Name three colours of the sea."


@pytest.fixture
def server(served: Served, monkeypatch: pytest.MonkeyPatch) -> WerkServer:
    """What a Werk Server node makes: the key from the variable it names."""
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    (connection,) = NODES["WerkServer"]().connect(served.base_url, KEY_VARIABLE)
    return connection


def _resident(served: Served, model: str) -> bool | None:
    with served.client(KEY) as http:
        models = http.get("/werk/v1/models").json()["models"]
    return next(m["resident"] for m in models if m["id"] == model)


def _messages(*turns: str) -> list[dict[str, str]]:
    roles = ["user", "assistant"]
    return [{"role": "system", "content": SYSTEM}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)
    ]


def test_the_dropdowns_list_what_werk_serves(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_URL", served.base_url)
    monkeypatch.setenv("WERK_API_KEY", KEY)
    assert NODES["WerkChat"].INPUT_TYPES()["required"]["model"][0] == [DEMO]
    assert NODES["WerkImage"].INPUT_TYPES()["required"]["model"][0] == [IMAGE]
    assert NODES["WerkSpeech"].INPUT_TYPES()["required"]["model"][0] == [TTS]
    assert NODES["WerkUnload"].INPUT_TYPES()["required"]["model"][0] == [ALL, DEMO, IMAGE, TTS]


def test_chat_answers_what_the_model_answers(served: Served, server: WerkServer) -> None:
    expected = one_shot(served, _messages(PROMPT), 12)
    (text,) = NODES["WerkChat"]().chat(
        model=DEMO, system=SYSTEM, prompt=PROMPT, max_tokens=12, temperature=0.0, seed=0,
        unload_after=True, server=server,
    )  # fmt: skip
    assert text and text == expected
    assert _resident(served, DEMO) is False  # unload_after


def test_prefill_then_decode_equals_a_one_shot_completion(
    served: Served, server: WerkServer
) -> None:
    (handoff,) = NODES["WerkPrefill"]().prefill(
        model=DEMO, system=SYSTEM, prompt=PROMPT, allow_experimental=True, server=server
    )
    assert isinstance(handoff, WerkStateHandoff) and "token hidden" in str(handoff)
    decode = NODES["WerkDecode"]()
    (text,) = decode.decode(handoff=handoff, max_tokens=12, temperature=0.0, seed=0, stop="")
    assert text == one_shot(served, _messages(PROMPT), 12)
    # ComfyUI re-running the decode on the same value (its cache was defeated): refused in
    # the node, before any request, and the message names no token.
    with pytest.raises(WerkNodeError) as again:
        decode.decode(handoff=handoff, max_tokens=12, temperature=0.0, seed=0, stop="")
    assert again.value.code == "invalid_handoff" and "wh_" not in str(again.value)


def test_the_server_refuses_a_second_use_and_the_error_shows_no_token(
    served: Served, server: WerkServer
) -> None:
    body = {"model": DEMO, "prompt": PROMPT, "allow_experimental": True}
    with served.client(KEY, timeout=120) as http:
        token = http.post("/werk/v1/prefill", json=body).json()["handoff"]["token"]
    twins = [
        WerkStateHandoff(token, model=DEMO, expires_at="", server=server, state_id=None)
        for _ in range(2)
    ]
    decode = NODES["WerkDecode"]()
    decode.decode(handoff=twins[0], max_tokens=4, temperature=0.0, seed=0, stop="")
    with pytest.raises(WerkNodeError) as second:
        decode.decode(handoff=twins[1], max_tokens=4, temperature=0.0, seed=0, stop="")
    assert second.value.code == "invalid_handoff" and second.value.status == 410
    assert token not in str(second.value) and token not in repr(second.value.args)


def test_prefill_without_the_opt_in_is_refused_clearly(server: WerkServer) -> None:
    with pytest.raises(WerkNodeError) as refused:
        NODES["WerkPrefill"]().prefill(
            model=DEMO, system="", prompt=PROMPT, allow_experimental=False, server=server
        )
    assert refused.value.code == "experimental_opt_in_required"
    assert "allow_experimental" in str(refused.value)


def test_a_named_state_is_saved_then_continued_by_the_next_turn(
    served: Served, server: WerkServer
) -> None:
    named, decode = NODES["WerkNamedState"](), NODES["WerkDecode"]()
    common = {"model": DEMO, "system": SYSTEM, "prompt": PROMPT, "allow_experimental": True}
    handoff, saved, report = named.run(
        **common, action="save", retention="disk", ttl_seconds=3600, pin=True, server=server
    )
    assert saved.startswith("st_") and handoff.state_id == saved and "fresh" in report
    with served.client(KEY) as http:
        state = http.get(f"/werk/v1/states/{saved}").json()
    assert state["pinned"] is True and state["expires_at"] and state["tier"] == "disk"
    (reply,) = decode.decode(handoff=handoff, max_tokens=8, temperature=0.0, seed=0, stop="")

    followup = "And of the sky?"
    handoff2, kept, report2 = named.run(
        **common, action="resume", retention="disk", ttl_seconds=0, pin=False, state_id=saved,
        reply=reply, followup=followup, server=server,
    )  # fmt: skip
    assert kept.startswith("st_") and kept != saved  # a new state for the longer conversation
    assert f"prefix match of {saved}" in report2, report2
    (text,) = decode.decode(handoff=handoff2, max_tokens=8, temperature=0.0, seed=0, stop="")
    assert text == one_shot(served, _messages(PROMPT, reply, followup), 8)


def test_resume_fails_closed_for_an_unknown_or_foreign_state(
    served: Served, server: WerkServer
) -> None:
    named = NODES["WerkNamedState"]()
    common = {
        "model": DEMO, "system": "", "prompt": "A prompt nothing was saved for.",
        "retention": "disk", "ttl_seconds": 0, "pin": False, "allow_experimental": True,
    }  # fmt: skip
    with pytest.raises(WerkNodeError) as unknown:
        named.run(**common, action="resume", state_id="st_doesnotexist", server=server)
    assert unknown.value.code == "not_found"
    with pytest.raises(WerkNodeError) as nothing:
        named.run(**common, action="resume", server=server)
    assert nothing.value.code == "reuse_unavailable"
    _, saved, _ = named.run(**common, action="save", server=server)
    other = WerkServer.from_environment(served.base_url, OTHER_KEY)
    with pytest.raises(WerkNodeError) as foreign:
        named.run(**common, action="resume", state_id=saved, server=other)
    assert foreign.value.code == "not_found"  # another key's state does not exist for it


def test_memory_reports_werks_figures(served: Served, server: WerkServer) -> None:
    shown = NODES["WerkMemory"]().read(server=server)
    (summary,) = shown["result"]
    assert shown["ui"]["text"] == (summary,)
    with served.client(KEY) as http:
        memory = http.get("/werk/v1/memory").json()
    assert summary.startswith(f"pressure: {memory['pressure']}\nhost: ")
    assert "GiB used of" in summary and "Werk managed:" in summary


def test_unload_frees_loaded_models_and_passes_its_input_through(
    served: Served, server: WerkServer
) -> None:
    NODES["WerkChat"]().chat(
        model=DEMO, system="", prompt="hi", max_tokens=2, temperature=0.0, seed=0,
        unload_after=False, server=server,
    )  # fmt: skip
    assert _resident(served, DEMO) is True
    shown = NODES["WerkUnload"]().unload(model=ALL, passthrough="a prompt", server=server)
    passthrough, report = shown["result"]
    assert passthrough == "a prompt" and DEMO in report.split("unloaded: ")[1]
    assert _resident(served, DEMO) is False
    handoff = WerkStateHandoff("wh_x", model=DEMO, expires_at="", server=server, state_id=None)
    with pytest.raises(WerkNodeError, match="does not pass through"):
        NODES["WerkUnload"]().unload(model=DEMO, passthrough=handoff, server=server)


def test_image_and_speech_come_out_as_comfyui_values(
    served: Served, werk_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_media.environment import locate

    monkeypatch.setenv("WERK_BACKENDS_DIR", werk_env["WERK_BACKENDS_DIR"])
    python = locate().python  # torch, numpy and Pillow: what ComfyUI's environment has
    args = {
        "base_url": served.base_url,
        "key_variable": KEY_VARIABLE,
        "image": {"model": IMAGE, "prompt": "a red cat", "negative_prompt": "", "width": 64,
                  "height": 48, "steps": 4, "guidance_scale": 7.5, "seed": 3, "count": 2},
        "speech": {"model": TTS, "text": "Hello from Werk.", "voice": "", "seed": 1},
    }  # fmt: skip
    ran = subprocess.run(
        [str(python), Path(__file__).with_name("_comfyui_media_nodes.py"), PACK, json.dumps(args)],
        env={**server_env(served.home), KEY_VARIABLE: KEY},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-4000:]
    out = json.loads(ran.stdout.strip().splitlines()[-1])
    image = out["image"]
    assert image["shape"] == [2, 48, 64, 3] and image["dtype"] == "torch.float32"
    assert 0.0 <= image["min"] < image["max"] <= 1.0

    # The same request through the API gives the same pixels.
    body = {k: v for k, v in args["image"].items() if k not in ("width", "height", "count")}
    body.update(size="64x48", n=2, response_format="b64_json", negative_prompt=None)
    with served.client(KEY, timeout=600) as http:
        data = http.post("/v1/images/generations", json=body).json()["data"]
    from PIL import Image

    pixels = sum(
        sum(Image.open(io.BytesIO(base64.b64decode(item["b64_json"]))).convert("RGB").tobytes())
        for item in data
    )
    assert image["sum"] == pytest.approx(pixels / 255.0, rel=1e-6)

    audio = out["audio"]
    assert audio["shape"][:2] == [1, 1] and audio["shape"][2] > 1000
    assert audio["dtype"] == "torch.float32" and -1.0 <= audio["min"] < 0 < audio["max"] <= 1.0
    with served.client(KEY, timeout=600) as http:
        jobs = http.get("/v1/jobs").json()["data"]
        wav = http.post("/v1/audio/speech", json={**_speech_body(args), "model": TTS}).content
    assert any(job["kind"] == "audio.speech" and job["status"] == "completed" for job in jobs)
    with wave.open(io.BytesIO(wav)) as reference:
        assert audio["sample_rate"] == reference.getframerate()
        assert audio["shape"][2] == reference.getnframes()
    # The progress bar of node 7 moved through the job's stages to the end (4 of 4).
    progress = out["progress"]
    assert progress and progress[-1] == [4, 4, "7"]
    assert [p[0] for p in progress] == sorted(p[0] for p in progress)


def _speech_body(args: dict[str, Any]) -> dict[str, Any]:
    return {"input": args["speech"]["text"], "seed": args["speech"]["seed"]}


class _Recorder(BaseHTTPRequestHandler):
    """Stands for a Werk server whose backend moves experts (none here does): records the
    request and answers the protocol's ``ExpertActionResult`` shape."""

    seen: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append((self.path, body))
        answer = json.dumps(
            {"dry_run": body["dry_run"], "planned": [], "applied": [], "skipped": []}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *_: Any) -> None:
        pass


def test_expert_nodes_opt_in_on_every_call_and_say_when_unsupported(server: WerkServer) -> None:
    with pytest.raises(WerkNodeError) as unsupported:  # llama.cpp moves no experts
        NODES["WerkExpertsPrefetch"]().act(
            model=DEMO, experts="1, 2", target="ram", dry_run=True, server=server
        )
    assert unsupported.value.code == "unsupported" and unsupported.value.status == 501
    recorder = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    try:
        local = WerkServer.from_environment(f"http://127.0.0.1:{recorder.server_port}", "")
        NODES["WerkExpertsEvict"]().act(
            model=DEMO, experts="7\n8", target="vram", dry_run=False, server=local
        )
    finally:
        recorder.shutdown()
        recorder.server_close()
    assert _Recorder.seen == [
        ("/werk/v1/experts/demo/evict",
         {"experts": ["7", "8"], "target": "vram", "dry_run": False, "allow_experimental": True}),
    ]  # fmt: skip


def test_a_wrong_key_says_how_to_set_one(served: Served) -> None:
    wrong = WerkServer.from_environment(served.base_url, "not-the-key-000000000000")
    with pytest.raises(WerkNodeError) as refused:
        NODES["WerkMemory"]().read(server=wrong)
    assert refused.value.code == "unauthenticated" and "WERK_API_KEY" in str(refused.value)
    assert "not-the-key" not in str(refused.value)
    assert httpx.get(f"{served.base_url}/werk/v1/health").status_code == 200
