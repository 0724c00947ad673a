"""``werk models create-demo --kind onnx``: the host's tiny Llama (:func:`werk.tiny_llama_script`,
the same weights as the Transformers and MLX demos for a seed), converted by ONNX Runtime GenAI's
model builder (fp32, CPU) in the onnx environment."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError, tiny_llama_script

from .environment import INSTALL_HINT, locate

__all__ = ["DEMOS"]

MARKER = "werk-demo.json"


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest(f"{what} failed (its output is above)")
    return done.stdout


def _create(request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest("the onnx demo has one size: tiny")
    try:
        python = str(locate().python)
    except WerkError:
        raise InvalidRequest(
            f"the onnx demo is built in the onnx environment; {INSTALL_HINT}"
        ) from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / MARKER).exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    with tempfile.TemporaryDirectory(prefix="werk-onnx-demo-") as scratch:
        source, built = Path(scratch) / "llama", Path(scratch) / "onnx"
        request.progress(f"writing the tiny Llama (seed {request.seed})")
        _run([python, str(tiny_llama_script()), str(source), str(request.seed)], "the tiny Llama")
        request.progress(f"converting it with onnxruntime_genai.models.builder to {target}")
        _run(
            [python, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o",
             str(built), "-p", "fp32", "-e", "cpu"],
            "the ONNX Runtime GenAI model builder",
        )  # fmt: skip
        shutil.copy2(source / MARKER, built / MARKER)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(built, target)
    return sorted(p for p in target.iterdir() if p.is_file() and p.name != MARKER)


DEMOS = (
    DemoModel(
        kind="onnx",
        backend="onnx-genai",
        description="tiny random-weight Llama converted to ONNX Runtime GenAI (fp32, CPU), "
        "needs the onnx env",
        create=_create,
    ),
)
