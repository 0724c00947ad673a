"""Where the ONNX worker's and reference runner's Python comes from.

``WERK_ONNX_PYTHON`` when set, else the managed environment ``werk backends install onnx``
builds: ONNX Runtime GenAI 0.18.0 (a CPU wheel; it brings ONNX Runtime) for inference, and its
model builder's needs — torch 2.13.0 (the CPU build here), Transformers 5.17.0, ``onnx``,
``onnx-ir`` — to convert a Transformers model (``werk models create-demo --kind onnx`` does).
"""

from __future__ import annotations

from werk import EnvironmentSpec, FoundPython, locate_python

__all__ = ["INSTALL_HINT", "environment_spec", "locate"]

NAME = "onnx"
PYTHON_ENV = "WERK_ONNX_PYTHON"
INSTALL_HINT = "run `werk backends install onnx`"
REQUIREMENTS = (
    "onnxruntime-genai==0.18.0",
    "onnx>=1.17",
    "onnx-ir>=0.1",
    "torch==2.13.0",
    "transformers==5.17.0",
    "tokenizers>=0.22",
    "safetensors>=0.4",
    "numpy>=1.26",
)


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="ONNX Runtime GenAI 0.18 (CPU) and its model builder (torch, Transformers, "
        "onnx) for the onnx-genai worker and the onnx-runner reference runner",
        requirements=REQUIREMENTS,
        imports=("onnxruntime_genai", "onnx", "onnx_ir", "torch", "transformers"),
    )


def locate() -> FoundPython:
    """``WERK_ONNX_PYTHON``, else the managed environment; ``Unavailable`` naming the install
    command when there is neither."""
    return locate_python(
        environment_spec(), setting=PYTHON_ENV, missing="ONNX Runtime GenAI is not installed"
    )
