"""Names shared by the tests of the ComfyUI node pack and the n8n package."""

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
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
CREDENTIAL = {"id": "werkcredential01", "name": "Werk"}  # the Werk API credential in n8n


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
    credential = {"werkApi": CREDENTIAL}
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


@dataclass
class N8n:
    """A real n8n (``argv``: how to start its CLI) with its own user folder (``env``)."""

    argv: list[str]
    env: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.argv, *args], env=self.env, capture_output=True, text=True, timeout=600,
            check=False,
        )  # fmt: skip

    def execute(self, workflow_id: str) -> tuple[dict[str, Any], str]:
        """The execution ``n8n execute --rawOutput`` prints, and everything it printed (a
        failed run prints text after the JSON)."""
        ran = self.run("execute", f"--id={workflow_id}", "--rawOutput")
        printed = ran.stdout + ran.stderr
        start = 0 if ran.stdout.startswith("{") else ran.stdout.find("\n{") + 1
        assert start > 0 or ran.stdout.startswith("{"), printed[-4000:]
        execution, _ = json.JSONDecoder().raw_decode(ran.stdout[start:])
        return execution, printed


def n8n_with_werk(
    argv: list[str],
    root: Path,
    base_url: str,
    workflows: list[dict[str, Any]],
    *,
    allow_experimental: bool,
    env: dict[str, str] | None = None,
) -> N8n:
    """An n8n whose custom extensions hold the built package (as a user of a self-built copy
    installs it; n8n names its nodes ``CUSTOM.<name>``), with the Werk credential (``KEY``)
    and ``workflows`` imported by n8n's own CLI."""
    installed = root / "extensions" / "node_modules" / "n8n-nodes-werk"
    installed.mkdir(parents=True)
    shutil.copytree(N8N_PACKAGE / "dist", installed / "dist")
    shutil.copy(N8N_PACKAGE / "package.json", installed / "package.json")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "N8N_", "PYTEST_"))}
    clean.update(
        N8N_USER_FOLDER=str(root / "user"),
        N8N_CUSTOM_EXTENSIONS=str(root / "extensions"),
        N8N_ENCRYPTION_KEY="werk-n8n-test-encryption-key",
        N8N_DIAGNOSTICS_ENABLED="false",
        N8N_DEFAULT_BINARY_DATA_MODE="default",  # binary data inline in the execution output
        **(env or {}),
    )
    n8n = N8n(argv, clean)
    data = {"baseUrl": base_url, "apiKey": KEY, "allowExperimental": allow_experimental}
    (root / "credentials.json").write_text(
        json.dumps([{**CREDENTIAL, "type": "werkApi", "data": data}])
    )
    (root / "workflows.json").write_text(json.dumps(workflows))
    for command, file in (("import:credentials", "credentials"), ("import:workflow", "workflows")):
        imported = n8n.run(command, f"--input={root / f'{file}.json'}")
        assert imported.returncode == 0, imported.stdout[-3000:] + imported.stderr[-3000:]
    return n8n
