"""``werk models create-demo --kind image|tts|asr|classify|qwen-tts``: tiny media models
written by the media python (the Qwen3-TTS one by the qwen-tts python), deterministic for a
seed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError

from .environment import INSTALL_HINT, QWEN_INSTALL_HINT, MediaPython, locate, locate_qwen

__all__ = ["DEMOS"]

IMAGE_SCRIPT = Path(__file__).with_name("_tiny_image.py")
AUDIO_SCRIPT = Path(__file__).with_name("_tiny_audio.py")
QWEN_SCRIPT = Path(__file__).with_name("_tiny_qwen_tts.py")
TEXT_SCRIPT = Path(__file__).with_name("_tiny_text.py")
WHAT = {
    "image": "a tiny Stable Diffusion pipeline",
    "tts": "a tiny VITS text-to-speech model",
    "asr": "a tiny wav2vec2 speech recognizer",
    "classify": "a tiny BERT text classifier",
    "qwen-tts": "a tiny Qwen3-TTS CustomVoice model",
}
SCRIPTS = {
    "image": [str(IMAGE_SCRIPT)],
    "tts": [str(AUDIO_SCRIPT), "tts"],
    "asr": [str(AUDIO_SCRIPT), "asr"],
    "classify": [str(TEXT_SCRIPT)],
    "qwen-tts": [str(QWEN_SCRIPT)],
}


def _python(kind: str) -> MediaPython:
    qwen = kind == "qwen-tts"
    try:
        return locate_qwen() if qwen else locate()
    except WerkError:
        what = "the qwen-tts environment" if qwen else "the media libraries"
        hint = QWEN_INSTALL_HINT if qwen else INSTALL_HINT
        raise InvalidRequest(f"the {kind} demo is written with {what}; {hint}") from None


def _create(kind: str, request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest(f"the {kind} demo has one size: tiny")
    found = _python(kind)
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing {WHAT[kind]} (seed {request.seed}) to {target}")
    done = subprocess.run(
        [str(found.python), *SCRIPTS[kind], str(target), str(request.seed)],
        capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest(f"writing the {kind} demo failed (its output is above)")
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


def _maker(kind: str) -> Callable[[DemoRequest], list[Path]]:
    return lambda request: _create(kind, request)


DEMOS = (
    DemoModel(
        kind="image",
        backend="media",
        description="tiny random-weight Stable Diffusion pipeline (64x64 in seconds), "
        "needs the media env",
        create=_maker("image"),
    ),
    DemoModel(
        kind="tts",
        backend="media",
        description="tiny random-weight VITS text-to-speech model (16 kHz), needs the media env",
        create=_maker("tts"),
    ),
    DemoModel(
        kind="asr",
        backend="media",
        description="tiny random-weight wav2vec2 CTC speech recognizer, needs the media env",
        create=_maker("asr"),
    ),
    DemoModel(
        kind="classify",
        backend="media",
        description="tiny random-weight BERT text classifier (negative/positive), needs the "
        "media env",
        create=_maker("classify"),
    ),
    DemoModel(
        kind="qwen-tts",
        backend="qwen-tts",
        description="tiny random-weight Qwen3-TTS CustomVoice model (24 kHz, speaker 'tiny'), "
        "needs the qwen-tts env",
        create=_maker("qwen-tts"),
    ),
)
