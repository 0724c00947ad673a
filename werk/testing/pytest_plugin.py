"""pytest plugin of ``werk.testing`` (registered through the ``pytest11`` entry point).

Provides one fixture, ``werk_conformance``: a function ``(backend, model=None, **kwargs)`` that
runs :func:`werk.testing.conformance` in a private ``WERK_HOME`` under the test's ``tmp_path``,
fails the test with the kit's full report when a check failed, and returns the report.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from . import ConformanceReport, conformance


@pytest.fixture
def werk_conformance(tmp_path: Path) -> Callable[..., ConformanceReport]:
    def run(backend: str, model: Any = None, **kwargs: Any) -> ConformanceReport:
        home = tmp_path / "werk-conformance-home"
        home.mkdir(mode=0o700, exist_ok=True)
        report = conformance(backend, model, home=kwargs.pop("home", home), **kwargs)
        report.raise_for_failures()
        return report

    return run
