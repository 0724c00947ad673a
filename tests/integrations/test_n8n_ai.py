"""The Werk Chat Model sub-node inside a real n8n with the AI node SDK (opt-in: n8n 2.16 and
later need Node.js 22.16+, and ``make test`` installs only n8n 2.8.4, for Node.js 20).
``WERK_N8N_AI_DIR`` names a folder where n8n is installed (``node_modules/n8n``),
``WERK_N8N_AI_NODE`` the Node.js that runs it; skipped otherwise, saying so
(docs/integrations.md says how to get both).

A Basic LLM Chain fed by the Werk Chat Model (the demo model, greedy, 8 tokens) answers what
``/v1/chat/completions`` answers for the same prompt; n8n logs the model's run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _integration_support import PROMPT, chain_version, chain_workflow, n8n_with_werk, one_shot

from werk.testing.server import WerkServer

AI_DIR = os.environ.get("WERK_N8N_AI_DIR", "")
AI_NODE = os.environ.get("WERK_N8N_AI_NODE", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(  # decided before any fixture starts a server
        not AI_DIR or not AI_NODE,
        reason="opt-in: the Werk Chat Model needs n8n >= 2.16 on Node.js >= 22.16, which "
        "`make test` does not install; set WERK_N8N_AI_DIR and WERK_N8N_AI_NODE "
        "(docs/integrations.md)",
    ),
]


def test_a_basic_llm_chain_answers_with_the_werk_chat_model(
    served: WerkServer, tmp_path: Path
) -> None:
    root = Path(AI_DIR)
    n8n = n8n_with_werk(
        [AI_NODE, str(root / "node_modules" / "n8n" / "bin" / "n8n")], tmp_path, served.base_url,
        [chain_workflow(chain_version(root))], allow_experimental=False,
        env={"PATH": f"{Path(AI_NODE).parent}:{os.environ['PATH']}"},
    )  # fmt: skip
    execution, printed = n8n.execute("werkaichain00001")
    assert execution["status"] == "success", printed[-4000:]
    run_data = execution["data"]["resultData"]["runData"]
    (chain,) = run_data["Chain"][0]["data"]["main"][0]
    expected = one_shot(served, [{"role": "user", "content": PROMPT}], 8)
    assert chain["json"]["text"] == expected
    assert run_data["Werk Chat Model"][0]["executionStatus"] == "success"
