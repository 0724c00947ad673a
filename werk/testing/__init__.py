"""The conformance kit: check a Werk backend the way the host will call it.

Point it at a backend your plugin registers::

    import werk.testing

    report = werk.testing.conformance(backend="echo")
    report.raise_for_failures()          # an AssertionError listing every failed check

or from a shell (exit status 0 only when every check passed)::

    python -m werk.testing --backend echo

or as a pytest fixture (the ``werk`` distribution registers this module's pytest plugin)::

    def test_my_backend_conforms(werk_conformance):
        werk_conformance("echo")

What it checks is listed in :mod:`werk.testing.checks`. It loads plugins through their entry
points (so the plugin must be installed, editable or not), starts the backend's runtime through
its ``start`` coroutine, and runs everything through the in-process control service that
``werk serve`` uses, in a private temporary ``WERK_HOME``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import anyio

from ..backends import ModelSpec
from ..plugins import WerkPluginManager
from .checks import Check, ConformanceError, ConformanceReport, check_backend

__all__ = ["Check", "ConformanceError", "ConformanceReport", "check_backend", "conformance"]


def conformance(
    backend: str,
    model: ModelSpec | None = None,
    *,
    pm: WerkPluginManager | None = None,
    home: Path | None = None,
) -> ConformanceReport:
    """Run the kit against ``backend`` and return its report (blocking; starts its own event
    loop). Arguments as :func:`werk.testing.checks.check_backend`."""
    return anyio.run(functools.partial(check_backend, backend, model, pm=pm, home=home))
