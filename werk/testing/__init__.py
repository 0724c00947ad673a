"""The conformance kit: check a Werk backend the way the host will call it.

Point it at a backend your plugin registers::

    import werk.testing

    report = werk.testing.conformance("echo")
    report.raise_for_failures()          # an AssertionError listing every failed check

    # a model made of files, as ``werk models import`` would identify it
    werk.testing.conformance("mine", files=["model.bin"]).raise_for_failures(strict=True)

or from a shell (exit status 0 only when every check passed; ``--strict``: and no warning)::

    python -m werk.testing --backend echo

or as a pytest fixture (the ``werk`` distribution registers this module's pytest plugin)::

    def test_my_backend_conforms(werk_conformance):
        werk_conformance("echo")                     # or ("mine", files=[path], strict=True)

What it checks is listed in :mod:`werk.testing.checks`. It loads plugins through their entry
points (so the plugin must be installed, editable or not), starts the backend's runtime through
its ``start`` coroutine, and runs everything through the in-process control service that
``werk serve`` uses, in a private temporary ``WERK_HOME``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from ..backends import ModelSpec
from ..models import identity_of, model_files
from ..plugins import WerkPluginManager
from .checks import Check, ConformanceError, ConformanceReport, check_backend

__all__ = [
    "Check",
    "ConformanceError",
    "ConformanceReport",
    "check_backend",
    "conformance",
    "model_spec",
]


def model_spec(
    paths: Sequence[str | Path],
    backend: str,
    *,
    id: str = "conformance",
    options: dict[str, Any] | None = None,
) -> ModelSpec:
    """A :class:`werk.ModelSpec` for ``paths`` served by ``backend``, with the identity
    ``werk models import`` would give the same files (a hash over their names, sizes and
    SHA-256 digests).

    :raises werk.InvalidRequest: a path that is not a regular file.
    """
    files = model_files([Path(p) for p in paths])
    return ModelSpec(
        id=id,
        backend=backend,
        identity=identity_of(files),
        files=tuple(Path(f.path) for f in files),
        options=dict(options or {}),
    )


def conformance(
    backend: str,
    model: ModelSpec | None = None,
    *,
    files: Sequence[str | Path] | None = None,
    pm: WerkPluginManager | None = None,
    home: Path | None = None,
) -> ConformanceReport:
    """Run the kit against ``backend`` and return its report (blocking; starts its own event
    loop). ``files``: serve these model files (``model_spec(files, backend)``); give ``model``
    or ``files``, not both. Other arguments as :func:`werk.testing.checks.check_backend`."""
    if files is not None:
        if model is not None:
            raise TypeError("give model or files, not both")
        model = model_spec(files, backend)
    return anyio.run(functools.partial(check_backend, backend, model, pm=pm, home=home))
