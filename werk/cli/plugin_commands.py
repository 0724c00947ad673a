"""Letting plugins add commands through ``werk_register_commands``."""

from __future__ import annotations

import typer

from ..plugins import get_plugin_manager
from ._app import app
from .models import models_app

__all__ = ["register_plugin_commands"]


def register_plugin_commands() -> None:
    """Call every loaded plugin's ``werk_register_commands``; a raising plugin is reported on
    stderr and skipped."""
    pm = get_plugin_manager()
    for name, plugin in pm.implementers("werk_register_commands"):
        try:
            pm.call_plugin(plugin, "werk_register_commands", app=app, models=models_app)
        except Exception as exc:
            typer.echo(f"warning: plugin {name} failed to add commands: {exc}", err=True)
