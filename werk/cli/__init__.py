"""The ``werk`` command line.

Exit codes scripts can rely on: 0 success, 1 an error Werk reported, 2 a usage error.

Every ``werk`` invocation imports all command modules (typer builds the whole command tree), so
they import at module level only typer, the protocol types their options use and the standard
library; everything else is imported inside the command that uses it
(``benchmarks/cli_start.py`` measures what that buys).
"""

from __future__ import annotations

from . import backends, cache, chat, jobs, local, runtime, serve  # noqa: F401  (registers the commands)
from ._app import app
from .models import models_app
from .plugin_commands import register_plugin_commands

__all__ = ["app", "main", "models_app"]


def main() -> None:
    """Console-script entry point: plugin commands are added, then the CLI runs."""
    register_plugin_commands()
    app()
