"""The ``werk`` command line.

Exit codes scripts can rely on: 0 success, 1 an error Werk reported, 2 a usage error.

Every ``werk`` invocation imports all command modules (typer builds the whole command tree), so
they import at module level only typer, the protocol types their options use and the standard
library; everything else is imported inside the command that uses it
(``benchmarks/cli_start.py`` measures what that buys).
"""

from __future__ import annotations

import copy
import sys

from typer.models import CommandInfo

from . import backends, cache, chat, jobs, local, runtime, serve  # noqa: F401  (registers the commands)
from ._app import app
from .models import models_app
from .plugin_commands import register_plugin_commands

__all__ = ["app", "main", "models_app"]


def main() -> None:
    """Console-script entry point: plugin commands are added, then the CLI runs.

    When the first argument names one of Werk's own top-level commands (``werk serve ...``), the
    command tree is built with that command alone: typer turns every registered command's
    signature into click parameters before it parses anything (about 40 ms for all of them,
    plus loading the plugins' commands), and ``werk serve``'s start-up waits for it. Anything
    else (``werk``, ``--help``, a group, a plugin's command, a typo) gets the whole tree."""
    only = _own_command(sys.argv[1] if len(sys.argv) > 1 else "")
    if only is None:
        register_plugin_commands()
        app()
        return
    alone = copy.copy(app)
    alone.registered_commands = [only]
    alone.registered_groups = []
    alone()


def _own_command(name: str) -> CommandInfo | None:
    for info in app.registered_commands:
        callback = info.callback
        own = info.name or (callback.__name__.lower().replace("_", "-") if callback else None)
        if own == name and not info.hidden:
            return info
    return None
