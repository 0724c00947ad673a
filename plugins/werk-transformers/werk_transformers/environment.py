"""Where the Transformers worker's Python comes from.

The worker needs torch and Transformers. Werk uses, in order: the interpreter named by
``WERK_TRANSFORMERS_PYTHON``; the one Werk itself runs in when those libraries import there
(``pip install werk-transformers[torch]``); else the managed environment that ``werk backends
install transformers`` builds (``torch==2.13.0`` — on this kind of machine the CPU build —
Transformers 5.17.0, tokenizers, safetensors: the versions the media worker uses, so pip's
cache serves both). :func:`locate` says which, and reasons name it.
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

__all__ = ["INSTALL_HINT", "TransformersPython", "environment_spec", "locate"]

NAME = "transformers"
PYTHON_ENV = "WERK_TRANSFORMERS_PYTHON"
INSTALL_HINT = (
    "run `werk backends install transformers` (or `pip install werk-transformers[torch]`)"
)
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors")
REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==5.17.0",
    "tokenizers>=0.22",
    "safetensors>=0.4",
    "numpy>=1.26",
)


class TransformersPython(msgspec.Struct, frozen=True):
    """An interpreter with torch and Transformers, and where it came from."""

    python: Path
    source: str


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="torch (CPU build here) and Transformers for the text-generation worker",
        requirements=REQUIREMENTS,
        imports=("torch", "transformers", "tokenizers", "safetensors"),
    )


def _libraries_here() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in LIBRARIES)


def locate() -> TransformersPython:
    """The worker's python, in the documented order; ``Unavailable`` naming the install
    command when there is none."""
    configured = configured_python(PYTHON_ENV)
    if configured is not None:
        return TransformersPython(configured, PYTHON_ENV)
    if _libraries_here():
        return TransformersPython(
            Path(sys.executable), "Werk's own environment (werk-transformers[torch])"
        )
    managed = ManagedEnvironment(werk_home(), NAME).ready_python(environment_spec())
    if managed is not None:
        return TransformersPython(managed, "the managed transformers environment")
    raise Unavailable(
        f"torch and Transformers are not installed; {INSTALL_HINT}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )
