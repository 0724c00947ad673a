"""``werk models create-demo --kind image|tts|asr``: tiny media models written by the media
python (deterministic for a seed)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError

from .environment import INSTALL_HINT, locate

__all__ = ["DEMOS"]

IMAGE_SCRIPT = Path(__file__).with_name("_tiny_image.py")
AUDIO_SCRIPT = Path(__file__).with_name("_tiny_audio.py")
WHAT = {
    "image": "a tiny Stable Diffusion pipeline",
    "tts": "a tiny VITS text-to-speech model",
    "asr": "a tiny wav2vec2 speech recognizer",
}


def _create(kind: str, request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest(f"the {kind} demo has one size: tiny")
    try:
        found = locate()
    except WerkError:
        raise InvalidRequest(
            f"the {kind} demo is written with the media libraries; {INSTALL_HINT}"
        ) from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing {WHAT[kind]} (seed {request.seed}) to {target}")
    script = [str(IMAGE_SCRIPT)] if kind == "image" else [str(AUDIO_SCRIPT), kind]
    done = subprocess.run(
        [str(found.python), *script, str(target), str(request.seed)],
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
)
