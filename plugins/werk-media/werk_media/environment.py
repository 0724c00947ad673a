"""Where the media worker's Python comes from.

The worker needs torch, Diffusers and Transformers. Werk uses, in order: the interpreter named by
``WERK_MEDIA_PYTHON``; the one Werk itself runs in when those libraries import there
(``pip install werk-media[diffusers]``); else the managed environment that
``werk backends install media`` builds (``torch==2.13.0`` — on this kind of machine the CPU
build; a bare ``torch`` requirement pulls a multi-gigabyte CUDA build — Diffusers,
Transformers, Pillow, safetensors). :func:`locate` says which, and reasons name it.

The Qwen3-TTS worker runs in an environment of its own: ``qwen-tts`` 0.1.1 pins
``transformers==4.57.3`` (the generic worker's Diffusers needs a newer Transformers), so it is
never Werk's own environment. :func:`locate_qwen`: ``WERK_QWEN_TTS_PYTHON``, else the managed
environment of ``werk backends install qwen-tts``. That environment installs qwen-tts with
``--no-deps`` and what it really imports listed explicitly: its declared ``gradio`` serves only
its demo CLI, and PyPI's ``torchaudio`` does not load beside the CPU torch build here (the
worker then reports the 25 Hz voice-cloning path, which needs torchaudio's Kaldi features,
unsupported; the 12 Hz path does not need it).
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

__all__ = [
    "INSTALL_HINT",
    "LIBRARIES",
    "QWEN_INSTALL_HINT",
    "MediaPython",
    "environment_spec",
    "locate",
    "locate_qwen",
    "managed_python",
    "qwen_environment_spec",
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


QWEN_NAME = "qwen-tts"
QWEN_PYTHON_ENV = "WERK_QWEN_TTS_PYTHON"
QWEN_INSTALL_HINT = "run `werk backends install qwen-tts`"
QWEN_REQUIREMENTS = (
    "torch==2.13.0",
    "transformers==4.57.3",
    "accelerate==1.12.0",
    "librosa==0.11.0",
    "soundfile==0.14.0",
    "sox==1.5.0",
    "onnxruntime==1.32.0",
    "einops==0.8.2",
    "numpy>=1.26",
)
QWEN_PACKAGE = "qwen-tts==0.1.1"


class MediaPython(msgspec.Struct, frozen=True):
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


def qwen_environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=QWEN_NAME,
        description=f"{QWEN_PACKAGE} (Transformers 4.57.3, torch CPU build here) for the "
        "Qwen3-TTS worker",
        requirements=QWEN_REQUIREMENTS,
        without_dependencies=(QWEN_PACKAGE,),
        imports=("torch", "transformers", "accelerate", "librosa", "soundfile", "einops"),
        present=("qwen_tts",),  # its import needs the worker's torchaudio stand-in
    )


def locate_qwen() -> MediaPython:
    """The Qwen3-TTS python: ``WERK_QWEN_TTS_PYTHON``, else the managed environment."""
    configured = configured_python(QWEN_PYTHON_ENV)
    if configured is not None:
        return MediaPython(configured, QWEN_PYTHON_ENV)
    managed = ManagedEnvironment(werk_home(), QWEN_NAME).ready_python(qwen_environment_spec())
    if managed is not None:
        return MediaPython(managed, "the managed qwen-tts environment")
    raise Unavailable(
        f"qwen-tts is not installed; {QWEN_INSTALL_HINT}",
        capability=CapabilityId.MODEL_RESIDENCY,
        retryable=False,
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
