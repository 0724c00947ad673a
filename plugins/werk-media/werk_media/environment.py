"""Where the media worker's Python comes from.

The worker needs torch, Diffusers and Transformers. Werk uses, in order: the interpreter named by
``WERK_MEDIA_PYTHON``; the one Werk itself runs in when those libraries import there
(``pip install werk-media[diffusers]``); else the managed environment that
``werk backends install media`` builds (``torch==2.13.0`` — on this kind of machine the CPU
build; a bare ``torch`` requirement pulls a multi-gigabyte CUDA build — Diffusers,
Transformers, Pillow, safetensors). :func:`locate` says which, and reasons name it.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

from werk import (
    CapabilityId,
    EnvironmentSpec,
    ManagedEnvironment,
    Unavailable,
    configured_python,
    werk_home,
)

__all__ = [
    "INSTALL_HINT",
    "LIBRARIES",
    "MediaPython",
    "environment_spec",
    "locate",
    "managed_python",
]

NAME = "media"
PYTHON_ENV = "WERK_MEDIA_PYTHON"
INSTALL_HINT = "run `werk backends install media` (or `pip install werk-media[diffusers]`)"
LIBRARIES = ("torch", "diffusers", "transformers", "PIL", "safetensors")
REQUIREMENTS = (
    "torch==2.13.0",
    "diffusers==0.42.1",
    "transformers==5.17.0",
    "pillow>=10",
    "safetensors>=0.4",
    "numpy>=1.26",
)


@dataclass(frozen=True)
class MediaPython:
    """An interpreter with the media libraries, and where it came from."""

    python: Path
    source: str


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="torch (CPU build here), Diffusers and Transformers for the media worker",
        requirements=REQUIREMENTS,
        imports=("torch", "diffusers", "transformers", "PIL"),
    )


def managed_python() -> Path | None:
    return ManagedEnvironment(werk_home(), NAME).ready_python(environment_spec())


def _libraries_here() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in LIBRARIES)


def locate() -> MediaPython:
    """The media python, in the documented order; ``Unavailable`` naming the install command."""
    configured = configured_python(PYTHON_ENV)
    if configured is not None:
        return MediaPython(configured, PYTHON_ENV)
    if _libraries_here():
        return MediaPython(Path(sys.executable), "Werk's own environment (werk-media[diffusers])")
    managed = managed_python()
    if managed is not None:
        return MediaPython(managed, "the managed environment")
    raise Unavailable(
        f"the media libraries (torch, Diffusers, Transformers) are not installed; {INSTALL_HINT}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
    )
