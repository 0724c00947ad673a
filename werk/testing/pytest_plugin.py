"""pytest plugin of ``werk.testing`` (registered through the ``pytest11`` entry point).

Provides one fixture, ``werk_conformance``: a function
``(backend, model=None, *, files=None, strict=False, **kwargs)`` that runs
:func:`werk.testing.conformance` in a private ``WERK_HOME`` under the test's ``tmp_path``, fails
the test with the kit's full report when a check failed (with ``strict``: or warned), and returns
the report. ``files`` mirrors ``python -m werk.testing --file``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from . import ConformanceReport, conformance


@pytest.fixture
def werk_conformance(tmp_path: Path) -> Callable[..., ConformanceReport]:
    def run(
        backend: str,
        model: Any = None,
        *,
        files: Sequence[str | Path] | None = None,
        strict: bool = False,
        **kwargs: Any,
    ) -> ConformanceReport:
        home = tmp_path / "werk-conformance-home"
        home.mkdir(mode=0o700, exist_ok=True)
        report = conformance(backend, model, files=files, home=kwargs.pop("home", home), **kwargs)
        report.raise_for_failures(strict=strict)
        return report

    return run
