"""``werk models create-demo --kind image``: tiny media models written by the media python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError

from .environment import INSTALL_HINT, locate

__all__ = ["DEMOS"]

IMAGE_SCRIPT = Path(__file__).with_name("_tiny_image.py")


def _create_image(request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest("the image demo has one size: tiny")
    try:
        found = locate()
    except WerkError:
        raise InvalidRequest(
            f"the image demo is written with the media libraries; {INSTALL_HINT}"
        ) from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing a tiny Stable Diffusion pipeline (seed {request.seed}) to {target}")
    done = subprocess.run(
        [str(found.python), str(IMAGE_SCRIPT), str(target), str(request.seed)],
        capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest("writing the image demo failed (its output is above)")
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


DEMOS = (
    DemoModel(
        kind="image",
        backend="media",
        description="tiny random-weight Stable Diffusion pipeline (64x64 in seconds), "
        "needs the media env",
        create=_create_image,
    ),
)
