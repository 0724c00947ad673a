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

from werk import EnvironmentSpec, FoundPython, locate_python

__all__ = [
    "INSTALL_HINT",
    "LIBRARIES",
    "QWEN_INSTALL_HINT",
    "MediaPython",
    "environment_spec",
    "locate",
    "locate_qwen",
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


MediaPython = FoundPython
"""An interpreter with the media libraries, and where it came from."""


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
    return locate_python(
        qwen_environment_spec(), setting=QWEN_PYTHON_ENV, missing="qwen-tts is not installed"
    )


def locate() -> MediaPython:
    """The media python, in the documented order; ``Unavailable`` naming the install command."""
    return locate_python(
        environment_spec(),
        setting=PYTHON_ENV,
        missing="the media libraries (torch, Diffusers, Transformers) are not installed",
        own=LIBRARIES,
        hint=" (or `pip install werk-media[diffusers]`)",
    )
