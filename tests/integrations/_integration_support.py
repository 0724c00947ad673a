"""Names shared by the tests of the ComfyUI node pack and the n8n package."""

import json
import os
from pathlib import Path
from typing import Any

from werk.testing.server import WerkServer

PACK = Path(__file__).resolve().parents[2] / "integrations" / "comfyui-werk"
N8N_PACKAGE = Path(__file__).resolve().parents[2] / "integrations" / "n8n-nodes-werk"
N8N_VERSION = "2.8.4"
# The n8n `make n8n-runtime` installs (read before a test's hermetic environment).
N8N_DIR = Path(
    os.environ.get("WERK_N8N_DIR") or Path.home() / ".cache" / "werk" / "n8n" / N8N_VERSION
)
KEY, OTHER_KEY = "comfy-nodes-key-0123456789ab", "comfy-nodes-other-0123456789"
KEY_VARIABLE = "WERK_COMFY_TEST_KEY"
DEMO, IMAGE, TTS = "demo", "tiny-image", "tiny-tts"
PROMPT = "Name three colours of the sea."


def one_shot(served: WerkServer, messages: list[dict[str, str]], max_tokens: int) -> str:
    """The demo model's greedy answer to ``messages`` through ``/v1/chat/completions``."""
    body = {"model": DEMO, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    with served.client(KEY, timeout=120) as http:
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def chain_workflow(chain_version: float) -> dict[str, Any]:
    """Manual Trigger → Basic LLM Chain (``PROMPT``) fed by the Werk Chat Model (the demo
    model, greedy, 8 tokens)."""
    credential = {"werkApi": {"id": "werkcredential01", "name": "Werk"}}
    nodes = [
        {"id": "start", "name": "Start", "type": "n8n-nodes-base.manualTrigger",
         "typeVersion": 1, "position": [0, 0], "parameters": {}},
        {"id": "chain", "name": "Chain", "type": "@n8n/n8n-nodes-langchain.chainLlm",
         "typeVersion": chain_version, "position": [300, 0],
         "parameters": {"promptType": "define", "text": PROMPT}},
        {"id": "model", "name": "Werk Chat Model", "type": "CUSTOM.werkChatModel",
         "typeVersion": 1, "position": [300, 200], "credentials": credential,
         "parameters": {"model": DEMO, "options": {"maxTokens": 8, "temperature": 0}}},
    ]  # fmt: skip
    connections = {
        "Start": {"main": [[{"node": "Chain", "type": "main", "index": 0}]]},
        "Werk Chat Model": {
            "ai_languageModel": [[{"node": "Chain", "type": "ai_languageModel", "index": 0}]]
        },
    }
    return {"id": "werkaichain00001", "name": "Werk chain", "active": False, "settings": {},
            "nodes": nodes, "connections": connections}  # fmt: skip


def chain_version(n8n_root: Path) -> float:
    """The newest version of the Basic LLM Chain node this n8n has."""
    found = list(n8n_root.glob("node_modules/@n8n/n8n-nodes-langchain/dist/types/nodes.json"))
    assert found, f"no @n8n/n8n-nodes-langchain in {n8n_root}"
    for node in json.loads(found[0].read_text()):
        if node["name"] in ("chainLlm", "@n8n/n8n-nodes-langchain.chainLlm"):
            versions = node["version"]
            return float(max(versions) if isinstance(versions, list) else versions)
    raise AssertionError("no chainLlm node")
