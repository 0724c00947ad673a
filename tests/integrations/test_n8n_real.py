"""The n8n package inside a real n8n 2.8.4 (installed once by ``make n8n-runtime`` under
``~/.cache/werk/n8n``), beside a real ``werk serve`` with the demo models.

As a user of a self-built package does: the built package copied into a custom-extensions
folder (``N8N_CUSTOM_EXTENSIONS``; n8n names its nodes ``CUSTOM.<name>``), the credential and
the workflows imported with ``n8n import:credentials`` / ``import:workflow``, each workflow run
with ``n8n execute --id … --rawOutput``. Workflows: chat, prefill → decode, memory,
capabilities and models in one; speech and image in another (binary outputs); a decode run
twice on one prefill; a Basic LLM Chain with the Werk Chat Model, which needs n8n 2.16+. No
execution output, log line or error holds a handoff token.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest
from _integration_support import (
    CREDENTIAL,
    DEMO,
    IMAGE,
    N8N_DIR,
    TTS,
    N8n,
    chain_version,
    chain_workflow,
    n8n_with_werk,
    one_shot,
)

from werk.testing.server import WerkServer

pytestmark = pytest.mark.slow

N8N = N8N_DIR / "node_modules" / ".bin" / "n8n"
TOKEN = re.compile(r"wh_[A-Za-z0-9_\-]{8,}")
PROMPT = "Name three colours of the sea."


def _werk_node(name: str, position: int, **parameters: Any) -> dict[str, Any]:
    return {
        "id": name.lower(), "name": name, "type": "CUSTOM.werk", "typeVersion": 1,
        "position": [300, 200 * position], "parameters": parameters,
        "credentials": {"werkApi": CREDENTIAL},
    }  # fmt: skip


def _workflow(
    wid: str, nodes: list[dict[str, Any]], links: list[tuple[str, str]]
) -> dict[str, Any]:
    start = {"id": "start", "name": "Start", "type": "n8n-nodes-base.manualTrigger",
             "typeVersion": 1, "position": [0, 0], "parameters": {}}  # fmt: skip
    connections: dict[str, Any] = {}
    for source, target in links:
        outputs = connections.setdefault(source, {"main": [[]]})["main"][0]
        outputs.append({"node": target, "type": "main", "index": 0})
    return {"id": wid, "name": wid, "active": False, "settings": {}, "nodes": [start, *nodes],
            "connections": connections}  # fmt: skip


WORKFLOWS = [
    _workflow(
        "werktext00000001",
        [
            _werk_node("Chat", 0, resource="chat", operation="complete", model=DEMO, prompt=PROMPT,
                       options={"maxTokens": 8}),
            _werk_node("Prefill", 1, resource="state", operation="prefill", model=DEMO,
                       system="Be terse.", prompt=PROMPT),
            _werk_node("Decode", 2, resource="state", operation="decode",
                       handoff="={{ $json.handoff.ref }}", options={"maxTokens": 8}),
            _werk_node("Memory", 3, resource="memory", operation="get"),
            _werk_node("Capabilities", 4, resource="capability", operation="getAll",
                       capabilityModel=DEMO),
            _werk_node("Models", 5, resource="model", operation="getAll"),
        ],
        [("Start", "Chat"), ("Start", "Prefill"), ("Prefill", "Decode"), ("Start", "Memory"),
         ("Start", "Capabilities"), ("Start", "Models")],
    ),
    _workflow(
        "werkmedia0000001",
        [
            _werk_node("Speech", 0, resource="speech", operation="create", model=TTS,
                       input="Hello from n8n.", seed=1),
            _werk_node("Image", 1, resource="image", operation="generate", model=IMAGE,
                       prompt="a red cat",
                       imageOptions={"width": 64, "height": 48, "n": 2, "steps": 4, "seed": 3}),
        ],
        [("Start", "Speech"), ("Start", "Image")],
    ),
    _workflow(
        "werktwice0000001",
        [
            _werk_node("Prefill", 0, resource="state", operation="prefill", model=DEMO,
                       prompt=PROMPT),
            _werk_node("Decode", 1, resource="state", operation="decode",
                       handoff="={{ $json.handoff.ref }}", options={"maxTokens": 4}),
            _werk_node("Decode again", 2, resource="state", operation="decode",
                       handoff="={{ $('Prefill').item.json.handoff.ref }}",
                       options={"maxTokens": 4}),
        ],
        [("Start", "Prefill"), ("Prefill", "Decode"), ("Decode", "Decode again")],
    ),
]  # fmt: skip


@pytest.fixture(scope="module")
def n8n(served: WerkServer, tmp_path_factory: pytest.TempPathFactory) -> N8n:
    if not N8N.exists():
        pytest.fail(f"no n8n at {N8N}: run `make n8n-runtime` (make test does)")
    chain = chain_workflow(chain_version(N8N_DIR))  # the Werk Chat Model in an n8n without its SDK
    return n8n_with_werk(
        [str(N8N)], tmp_path_factory.mktemp("n8n"), served.base_url, [*WORKFLOWS, chain],
        allow_experimental=True,
    )  # fmt: skip


def _output(execution: dict[str, Any], node: str) -> list[dict[str, Any]]:
    (run,) = execution["data"]["resultData"]["runData"][node]
    assert run["executionStatus"] == "success", run
    return list(run["data"]["main"][0])


def test_chat_prefill_decode_memory_capabilities_models(n8n: N8n, served: WerkServer) -> None:
    execution, printed = n8n.execute("werktext00000001")
    assert execution["status"] == "success", printed[-4000:]
    assert not TOKEN.search(printed)
    (chat,) = _output(execution, "Chat")
    assert chat["json"]["text"] == one_shot(served, [{"role": "user", "content": PROMPT}], 8)
    (prefill,) = _output(execution, "Prefill")
    assert prefill["json"]["handoff"]["ref"].startswith("hr_")
    (decoded,) = _output(execution, "Decode")
    expected = one_shot(
        served, [{"role": "system", "content": "Be terse."}, {"role": "user", "content": PROMPT}], 8
    )
    assert decoded["json"]["text"] == expected and decoded["json"]["finish_reason"]
    (memory,) = _output(execution, "Memory")
    assert memory["json"]["host"]["total_bytes"] > 0 and memory["json"]["pressure"]
    rows = _output(execution, "Capabilities")
    assert any(r["json"]["id"] == "runtime.pd.prefill" for r in rows)
    models = sorted(m["json"]["id"] for m in _output(execution, "Models"))
    assert models == [DEMO, IMAGE, TTS]


def test_speech_and_image_as_binary_outputs(n8n: N8n) -> None:
    execution, printed = n8n.execute("werkmedia0000001")
    assert execution["status"] == "success", printed[-4000:]
    (speech,) = _output(execution, "Speech")
    wav = base64.b64decode(speech["binary"]["data"]["data"])
    assert speech["binary"]["data"]["mimeType"] == "audio/wav"
    assert wav[:4] == b"RIFF" and wav[8:12] == b"WAVE" and len(wav) == speech["json"]["bytes"]
    images = _output(execution, "Image")
    assert len(images) == 2
    for image in images:
        png = base64.b64decode(image["binary"]["data"]["data"])
        assert png[1:4] == b"PNG"
        assert (int.from_bytes(png[16:20]), int.from_bytes(png[20:24])) == (64, 48)


def test_a_second_decode_of_one_handoff_fails_without_showing_the_token(
    n8n: N8n,
) -> None:
    execution, printed = n8n.execute("werktwice0000001")
    assert execution["status"] == "error"
    assert not TOKEN.search(printed)
    assert _output(execution, "Decode")[0]["json"]["text"] is not None
    (again,) = execution["data"]["resultData"]["runData"]["Decode again"]
    assert again["executionStatus"] == "error"
    assert "single-use" in json.dumps(again["error"])


def test_the_chat_model_says_it_needs_a_newer_n8n(n8n: N8n) -> None:
    """n8n 2.8.4 has no AI node SDK: the package still loads (the runs above), and the Werk Chat
    Model fails its run with what it needs."""
    execution, printed = n8n.execute("werkaichain00001")
    assert execution["status"] == "error"
    assert "needs n8n 2.16 or newer" in printed
