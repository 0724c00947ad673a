"""Where the MLX runner's Python comes from.

In this order: ``WERK_MLX_PYTHON``; the managed environment ``werk backends install mlx``
builds — MLX 0.32.4 (``mlx[cpu]``, the CPU build, on Linux; Apple silicon uses the Metal one),
mlx-lm 0.32.2 and Transformers 5.17.0, plus torch 2.13.0 (the CPU build here) for
``werk models create-demo --kind mlx``, which writes the host's tiny Llama; else Werk's own
environment when ``mlx`` and ``mlx_lm`` import there.
"""

from __future__ import annotations

from werk import EnvironmentSpec, FoundPython, locate_python

__all__ = ["INSTALL_HINT", "environment_spec", "locate", "locate_vlm", "vlm_environment_spec"]

NAME = "mlx"
PYTHON_ENV = "WERK_MLX_PYTHON"
INSTALL_HINT = "run `werk backends install mlx`"
REQUIREMENTS = (
    "mlx[cpu]==0.32.4; sys_platform == 'linux'",
    "mlx==0.32.4; sys_platform == 'darwin'",
    "mlx-lm==0.32.2",
    "transformers==5.17.0",
    "torch==2.13.0",
    "numpy>=1.26",
)


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="MLX (CPU build on Linux) and mlx-lm for the mlx runner; torch for its demo",
        requirements=REQUIREMENTS,
        imports=("mlx.core", "mlx_lm", "transformers", "torch"),
    )


def locate() -> FoundPython:
    """The runner's python, in the documented order (the managed environment before Werk's
    own: only it has torch for the demo); ``Unavailable`` naming the install command."""
    return locate_python(
        environment_spec(),
        setting=PYTHON_ENV,
        missing="MLX and mlx-lm are not installed",
        own=("mlx", "mlx_lm"),
        own_first=False,
    )


VLM_NAME = "mlx-vlm"
VLM_PYTHON_ENV = "WERK_MLX_VLM_PYTHON"
VLM_REQUIREMENTS = (
    "mlx[cpu]==0.32.4; sys_platform == 'linux'",
    "mlx==0.32.4; sys_platform == 'darwin'",
    "mlx-vlm==0.7.10",
    "transformers==5.14.0",
    "torch==2.13.0",
    "pillow>=10",
    "numpy>=1.26",
)
"""MLX-VLM 0.7.10 with the Transformers it works with (5.14.0: 5.25 breaks its processors),
and torch for ``create-demo --kind mlx-vlm``."""


def vlm_environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=VLM_NAME,
        description="MLX-VLM 0.7.10 (Transformers 5.14.0) for the mlx-vlm runner; torch for "
        "its demo",
        requirements=VLM_REQUIREMENTS,
        imports=("mlx.core", "mlx_vlm", "transformers", "torch", "PIL"),
    )


def locate_vlm() -> FoundPython:
    """``WERK_MLX_VLM_PYTHON``, else the managed mlx-vlm environment."""
    return locate_python(
        vlm_environment_spec(), setting=VLM_PYTHON_ENV, missing="MLX-VLM is not installed"
    )
