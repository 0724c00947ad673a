"""``werk models create-demo --kind mlx``: the host's tiny Llama (:func:`werk.tiny_llama_script`,
the same weights as the Transformers and ONNX demos for a seed), which ``mlx_lm.load`` reads as
it is, written with the MLX python (its managed environment has torch for this)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError, tiny_llama_script

from .environment import INSTALL_HINT, locate

__all__ = ["DEMOS"]


def _create(request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest("the mlx demo has one size: tiny")
    try:
        python = str(locate().python)
    except WerkError:
        raise InvalidRequest(
            f"the mlx demo is written with the MLX python; {INSTALL_HINT}"
        ) from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing the tiny Llama (seed {request.seed}) to {target}")
    done = subprocess.run(
        [python, str(tiny_llama_script()), str(target), str(request.seed)],
        capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest(
            f"writing the mlx demo failed (its output is above; it needs torch: {INSTALL_HINT})"
        )
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


DEMOS = (
    DemoModel(
        kind="mlx",
        backend="mlx",
        description="tiny random-weight Llama for mlx-lm (the transformers demo's weights), "
        "needs the mlx env",
        create=_create,
    ),
)
