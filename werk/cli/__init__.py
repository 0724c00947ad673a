"""The ``werk`` command line.

Exit codes scripts can rely on: 0 success, 1 an error Werk reported, 2 a usage error.

``import werk.cli`` imports no command module: :data:`app` (the whole command tree) imports them
all on first access, and :func:`main` imports only the module of the top-level command it was
given (``werk serve`` does not import the chat, cache or runtime commands). Command modules
import at module level only typer, the protocol types their options use and the standard
library; everything else is imported inside the command that uses it
(``benchmarks/cli_start.py`` measures what that buys).
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from . import _gc
from .plugin_commands import register_plugin_commands

if TYPE_CHECKING:
    import typer

__all__ = ["app", "main", "models_app", "register_plugin_commands"]

OWN_COMMAND_MODULES: dict[str, str] = {
    "backends": "backends",
    "cache": "cache",
    "capabilities": "local",
    "chat": "chat",
    "completion": "completion",
    "jobs": "jobs",
    "models": "models",
    "plugins": "plugins",
    "ps": "runtime",
    "run": "chat",
    "runtime": "runtime",
    "serve": "serve",
}
"""Each of Werk's own top-level commands and groups → the ``werk.cli`` module registering it
(``tests/test_cli.py`` checks this against the whole tree)."""

PLUGIN_EXTENSIBLE = frozenset({"models"})
"""Own groups that ``werk_register_commands`` may add to: named first, they still load the
plugins' commands."""


def _whole_tree() -> typer.Typer:
    for module in sorted(set(OWN_COMMAND_MODULES.values())):
        importlib.import_module(f"{__name__}.{module}")
    from ._app import app as root

    return root


def __getattr__(name: str) -> Any:
    """``app`` (the whole tree, without plugin commands) and ``models_app``, built on access."""
    if name == "app":
        return _whole_tree()
    if name == "models_app":
        _whole_tree()
        from .models import models_app

        return models_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point: plugin commands are added, then the CLI runs.

    When the first argument names one of Werk's own top-level commands or groups (``werk serve
    ...``), only its module is imported and the command tree is built with it alone: typer
    turns every registered command's signature into click parameters before it parses anything
    (about 40 ms for all of them, plus loading the plugins' commands), and ``werk serve``'s
    start-up waits for it. Anything else (``werk``, ``--help``, a plugin's command, a typo)
    gets the whole tree, as does a group plugins may add to; the plugins are loaded for their
    commands only when one may add some (:func:`_plugins_may_add_commands`).

    The cyclic garbage collector is paused until the command has started
    (:mod:`werk.cli._gc`)."""
    _gc.pause()
    if "_WERK_COMPLETE" in os.environ:  # the completion script asks for candidates
        _complete()
        return
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    module = OWN_COMMAND_MODULES.get(name)
    if module is None or name in PLUGIN_EXTENSIBLE:
        if not _plugins_may_add_commands(name, sys.argv[2:3]):
            if module is not None:
                _alone(name, module)
            elif sys.argv[1:] in ([], ["--help"]):
                _listing(_whole_tree())()
            else:
                _whole_tree()()
            return
        root = _whole_tree()
        register_plugin_commands()
        root()
        return
    _alone(name, module)


def _complete() -> None:
    """Answer the shell completion script (``werk completion SHELL``) from the whole tree,
    plugin commands included. Click's own ``_WERK_COMPLETE=bash_source`` (``zsh_source``,
    ``fish_source``) prints the script, as ``werk completion SHELL`` does."""
    from typer._completion_classes import completion_init

    shell, _, instruction = os.environ["_WERK_COMPLETE"].partition("_")
    if instruction == "source" and shell in ("bash", "zsh", "fish"):
        from typer._completion_shared import get_completion_script

        print(get_completion_script(prog_name="werk", complete_var="_WERK_COMPLETE", shell=shell))
        return
    completion_init()
    root = _whole_tree()
    register_plugin_commands()
    root()


def _plugins_may_add_commands(name: str, sub: list[str]) -> bool:
    """Whether the plugins must be loaded for their commands: a name Werk does not know (first,
    or after ``models``) may be a plugin's command, or a typo answered with the whole tree's
    suggestions; otherwise the plugin command index decides (:mod:`werk.cli.plugin_index`;
    loading when it does not know)."""
    if name and not name.startswith("-") and name not in OWN_COMMAND_MODULES:
        return True
    if name == "models" and sub and not sub[0].startswith("-"):
        from .models import models_app

        if sub[0] not in {_name_of(c) for c in models_app.registered_commands}:
            return True
    from .plugin_index import plugins_add_commands

    return plugins_add_commands() is not False


def _alone(name: str, module: str) -> None:
    importlib.import_module(f"{__name__}.{module}")
    from ._app import app as root

    alone = copy.copy(root)
    alone.registered_commands = [c for c in root.registered_commands if _name_of(c) == name]
    alone.registered_groups = [g for g in root.registered_groups if g.name == name]
    alone()


def _listing(root: typer.Typer) -> typer.Typer:
    """``root`` for printing its own help (``werk``, ``werk --help``): the same names and help
    texts, but each command's parameters left out (a parameterless stand-in callback with the
    command's docstring) and each group without its commands. Typer turns every parameter into a
    click option before anything runs (about 40 ms for the whole tree); the top-level help shows
    none of them. ``tests/test_cli.py`` compares the output with the whole tree's."""
    listing = copy.copy(root)
    listing.registered_commands = [_parameterless(info) for info in root.registered_commands]
    groups = []
    for info in root.registered_groups:
        group = copy.copy(info)
        if info.typer_instance is not None:
            group.typer_instance = copy.copy(info.typer_instance)
            group.typer_instance.registered_commands = []
            group.typer_instance.registered_groups = []
        groups.append(group)
    listing.registered_groups = groups
    return listing


def _parameterless(info: Any) -> Any:
    callback = info.callback

    def stand_in() -> None:
        raise AssertionError("a help listing's stand-in ran")  # only help is printed

    if callback is not None:
        stand_in.__name__ = callback.__name__
        stand_in.__doc__ = callback.__doc__
    copied = copy.copy(info)
    copied.callback = stand_in
    return copied


def _name_of(info: Any) -> str | None:
    """A registered command's name as typer derives it (``info``: a ``CommandInfo``)."""
    callback = info.callback
    if info.hidden:
        return None
    return info.name or (callback.__name__.lower().replace("_", "-") if callback else None)
