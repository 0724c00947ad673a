"""Where the MLX runner's Python comes from.

In this order: ``WERK_MLX_PYTHON``; the managed environment ``werk backends install mlx``
builds — MLX 0.32.4 (``mlx[cpu]``, the CPU build, on Linux; Apple silicon uses the Metal one),
mlx-lm 0.32.2 and Transformers 5.17.0, plus torch 2.13.0 (the CPU build here) for
``werk models create-demo --kind mlx``, which writes the host's tiny Llama; else Werk's own
environment when ``mlx`` and ``mlx_lm`` import there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import msgspec

from werk import (
    CapabilityId,
    EnvironmentSpec,
    ManagedEnvironment,
    Unavailable,
    configured_python,
    werk_home,
)

__all__ = ["INSTALL_HINT", "MlxPython", "environment_spec", "locate"]

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


class MlxPython(msgspec.Struct, frozen=True):
    """An interpreter with MLX and mlx-lm, and where it came from."""

    python: Path
    source: str


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="MLX (CPU build on Linux) and mlx-lm for the mlx runner; torch for its demo",
        requirements=REQUIREMENTS,
        imports=("mlx.core", "mlx_lm", "transformers", "torch"),
    )


def locate() -> MlxPython:
    """The runner's python, in the documented order; ``Unavailable`` naming the install
    command when there is none."""
    configured = configured_python(PYTHON_ENV)
    if configured is not None:
        return MlxPython(configured, PYTHON_ENV)
    managed = ManagedEnvironment(werk_home(), NAME).ready_python(environment_spec())
    if managed is not None:
        return MlxPython(managed, "the managed mlx environment")
    if all(importlib.util.find_spec(name) is not None for name in ("mlx", "mlx_lm")):
        return MlxPython(Path(sys.executable), "Werk's own environment")
    raise Unavailable(
        f"MLX and mlx-lm are not installed; {INSTALL_HINT}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )
