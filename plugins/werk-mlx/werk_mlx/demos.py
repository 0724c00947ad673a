"""``werk models create-demo --kind mlx``: the host's tiny Llama (:func:`werk.tiny_llama_script`,
the same weights as the Transformers and ONNX demos for a seed), which ``mlx_lm.load`` reads as
it is, written with the MLX python (its managed environment has torch for this); ``--kind
mlx-vlm``: a tiny LLaVA around it (``_tiny_llava.py``), written with the mlx-vlm python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError, tiny_llama_script

from .environment import locate, locate_vlm

LLAVA_SCRIPT = Path(__file__).with_name("_tiny_llava.py")

__all__ = ["DEMOS"]


def _create(request: DemoRequest, kind: str) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest(f"the {kind} demo has one size: tiny")
    try:
        python = str((locate_vlm() if kind == "mlx-vlm" else locate()).python)
    except WerkError:
        what = f"the {kind} demo is written in the {kind} environment"
        raise InvalidRequest(f"{what}; run `werk backends install {kind}`") from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    script = tiny_llama_script()
    argv = [python, str(script), str(target), str(request.seed)]
    if kind == "mlx-vlm":
        argv = [python, str(LLAVA_SCRIPT), str(target), str(request.seed), str(script.parent)]
    request.progress(f"writing the tiny {'LLaVA' if kind == 'mlx-vlm' else 'Llama'} "
                     f"(seed {request.seed}) to {target}")  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest(
            f"writing the {kind} demo failed (its output is above; it needs torch: "
            f"run `werk backends install {kind}`)"
        )
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


DEMOS = (
    DemoModel(
        kind="mlx",
        backend="mlx",
        description="tiny random-weight Llama for mlx-lm (the transformers demo's weights), "
        "needs the mlx env",
        create=lambda request: _create(request, "mlx"),
    ),
    DemoModel(
        kind="mlx-vlm",
        backend="mlx-vlm",
        description="tiny random-weight LLaVA (32x32 images) for MLX-VLM, needs the mlx-vlm env",
        create=lambda request: _create(request, "mlx-vlm"),
    ),
)
