"""The Werk Chat Model sub-node inside a real n8n with the AI node SDK (opt-in: n8n 2.16 and
later need Node.js 22+, this machine's is 20). ``WERK_N8N_AI_DIR`` names a folder where n8n is
installed (``node_modules/n8n``), ``WERK_N8N_AI_NODE`` the Node.js ≥ 22 that runs it; skipped
otherwise, saying so (docs/integrations.md says how to get both).

A Basic LLM Chain fed by the Werk Chat Model (the demo model, greedy, 8 tokens) answers what
``/v1/chat/completions`` answers for the same prompt; n8n logs the model's run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from _integration_support import KEY, N8N_PACKAGE, PROMPT, chain_version, chain_workflow, one_shot

from werk.testing.server import WerkServer

pytestmark = pytest.mark.slow

AI_DIR = os.environ.get("WERK_N8N_AI_DIR", "")
AI_NODE = os.environ.get("WERK_N8N_AI_NODE", "")


def test_a_basic_llm_chain_answers_with_the_werk_chat_model(
    served: WerkServer, tmp_path: Path
) -> None:
    if not AI_DIR or not AI_NODE:
        pytest.skip("WERK_N8N_AI_DIR / WERK_N8N_AI_NODE are not set: the n8n 2.16+ run is opt-in")
    root = Path(AI_DIR)
    n8n = [AI_NODE, str(root / "node_modules" / "n8n" / "bin" / "n8n")]
    installed = tmp_path / "extensions" / "node_modules" / "n8n-nodes-werk"
    installed.mkdir(parents=True)
    shutil.copytree(N8N_PACKAGE / "dist", installed / "dist")
    shutil.copy(N8N_PACKAGE / "package.json", installed / "package.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WERK_", "N8N_", "PYTEST_"))}
    env.update(
        N8N_USER_FOLDER=str(tmp_path / "user"),
        N8N_CUSTOM_EXTENSIONS=str(tmp_path / "extensions"),
        N8N_ENCRYPTION_KEY="werk-n8n-test-encryption-key",
        N8N_DIAGNOSTICS_ENABLED="false",
        PATH=f"{Path(AI_NODE).parent}:{os.environ['PATH']}",
    )
    data = {"baseUrl": served.base_url, "apiKey": KEY, "allowExperimental": False}
    credential = {"id": "werkcredential01", "name": "Werk", "type": "werkApi", "data": data}
    (tmp_path / "credentials.json").write_text(json.dumps([credential]))
    (tmp_path / "workflows.json").write_text(json.dumps([chain_workflow(chain_version(root))]))
    for command, file in (("import:credentials", "credentials"), ("import:workflow", "workflows")):
        done = subprocess.run(
            [*n8n, command, f"--input={tmp_path / f'{file}.json'}"],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = subprocess.run(
        [*n8n, "execute", "--id=werkaichain00001", "--rawOutput"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    start = 0 if ran.stdout.startswith("{") else ran.stdout.find("\n{") + 1
    assert start >= 0 or ran.stdout.startswith("{"), ran.stdout[-4000:] + ran.stderr[-4000:]
    execution, _ = json.JSONDecoder().raw_decode(ran.stdout[start:])
    assert execution["status"] == "success", json.dumps(execution)[-4000:]
    run_data = execution["data"]["resultData"]["runData"]
    (chain,) = run_data["Chain"][0]["data"]["main"][0]
    expected = one_shot(served, [{"role": "user", "content": PROMPT}], 8)
    assert chain["json"]["text"] == expected
    assert run_data["Werk Chat Model"][0]["executionStatus"] == "success"
