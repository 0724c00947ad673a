"""The ``werk`` command line.

Exit codes scripts can rely on: 0 success, 1 an error Werk reported, 2 a usage error.
"""

from __future__ import annotations

from . import local, models, serve  # noqa: F401  (registers the commands)
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    """Console-script entry point."""
    app()
