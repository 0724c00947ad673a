"""Letting plugins add commands through ``werk_register_commands``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from ..plugins import WerkPluginManager

__all__ = ["register_plugin_commands"]


def register_plugin_commands(
    pm: WerkPluginManager | None = None,
    *,
    root: typer.Typer | None = None,
    models: typer.Typer | None = None,
) -> None:
    """Call every loaded plugin's ``werk_register_commands``; a raising plugin is reported on
    stderr and skipped.

    :param pm: the plugin manager (default: a new one loading the entry points).
    :param root: the ``werk`` application; ``models``: its ``werk models`` group (defaults:
        Werk's own).
    """
    from ..plugins import get_plugin_manager
    from ._app import app
    from .models import models_app
    from .plugin_index import remember_loaded

    root = app if root is None else root
    models = models_app if models is None else models
    if pm is None:
        pm = get_plugin_manager()
        remember_loaded(pm)
    for name, plugin in pm.implementers("werk_register_commands"):
        try:
            pm.call_plugin(plugin, "werk_register_commands", app=root, models=models)
        except Exception as exc:
            typer.echo(f"warning: plugin {name} failed to add commands: {exc}", err=True)
