"""Where the Transformers worker's Python comes from.

The worker needs torch and Transformers. Werk uses, in order: the interpreter named by
``WERK_TRANSFORMERS_PYTHON``; the one Werk itself runs in when those libraries import there
(``pip install werk-transformers[torch]``); else the managed environment that ``werk backends
install transformers`` builds (``torch==2.13.0`` — on this kind of machine the CPU build —
Transformers 5.17.0, tokenizers, safetensors: the versions the media worker uses, so pip's
cache serves both). :func:`locate` says which, and reasons name it.
"""

from __future__ import annotations

from werk import EnvironmentSpec, FoundPython, locate_python

__all__ = ["INSTALL_HINT", "environment_spec", "locate"]

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


def environment_spec() -> EnvironmentSpec:
    return EnvironmentSpec(
        name=NAME,
        description="torch (CPU build here) and Transformers for the text-generation worker",
        requirements=REQUIREMENTS,
        imports=("torch", "transformers", "tokenizers", "safetensors"),
    )


def locate() -> FoundPython:
    """The worker's python, in the documented order; ``Unavailable`` naming the install
    command when there is none."""
    return locate_python(
        environment_spec(),
        setting=PYTHON_ENV,
        missing="torch and Transformers are not installed",
        own=LIBRARIES,
        hint=" (or `pip install werk-transformers[torch]`)",
    )
