"""Names shared by the ComfyUI node pack's tests."""

from pathlib import Path

PACK = Path(__file__).resolve().parents[2] / "integrations" / "comfyui-werk"
KEY, OTHER_KEY = "comfy-nodes-key-0123456789ab", "comfy-nodes-other-0123456789"
KEY_VARIABLE = "WERK_COMFY_TEST_KEY"
DEMO, IMAGE, TTS = "demo", "tiny-image", "tiny-tts"
