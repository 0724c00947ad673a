"""``werk models create-demo --kind transformers``: a tiny random Llama with a locally trained
byte-level BPE tokenizer and a chat template, written by the worker's python, deterministic for
a seed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, WerkError, tiny_llama_script

from .environment import INSTALL_HINT, locate

__all__ = ["DEMOS"]


def _create(request: DemoRequest) -> list[Path]:
    if request.size != "tiny":
        raise InvalidRequest("the transformers demo has one size: tiny")
    try:
        found = locate()
    except WerkError:
        raise InvalidRequest(
            f"the transformers demo is written with torch and Transformers; {INSTALL_HINT}"
        ) from None
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing a tiny random Llama (seed {request.seed}) to {target}")
    done = subprocess.run(
        [str(found.python), str(tiny_llama_script()), str(target), str(request.seed)],
        capture_output=True, text=True, timeout=600, check=False,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest("writing the transformers demo failed (its output is above)")
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


DEMOS = (
    DemoModel(
        kind="transformers",
        backend="transformers",
        description="tiny random-weight Llama (2 layers, byte-level BPE, a chat template), "
        "needs the transformers env",
        create=_create,
    ),
)
