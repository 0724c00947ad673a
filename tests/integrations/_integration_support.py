"""Names shared by the tests of the ComfyUI node pack and the n8n package."""

import os
from pathlib import Path

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


def one_shot(served: WerkServer, messages: list[dict[str, str]], max_tokens: int) -> str:
    """The demo model's greedy answer to ``messages`` through ``/v1/chat/completions``."""
    body = {"model": DEMO, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0}
    with served.client(KEY, timeout=120) as http:
        answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])
