"""``werk completion SHELL``: the shell completion script for bash, zsh or fish."""

from __future__ import annotations

import enum

import typer

from ._app import app

__all__ = ["COMPLETE_VAR", "completion"]

COMPLETE_VAR = "_WERK_COMPLETE"
"""The environment variable the completion script sets when it asks ``werk`` for candidates."""


class Shell(enum.StrEnum):
    BASH = "bash"
    ZSH = "zsh"
    FISH = "fish"


_INSTALL = {
    Shell.BASH: "werk completion bash > ~/.local/share/bash-completion/completions/werk",
    Shell.ZSH: 'werk completion zsh > "${fpath[1]}/_werk"   # then: compinit',
    Shell.FISH: "werk completion fish > ~/.config/fish/completions/werk.fish",
}


@app.command("completion")
def completion(
    shell: Shell = typer.Argument(..., help="bash, zsh or fish."),
) -> None:
    """Print the completion script for SHELL: commands, subcommands, options and their
    choices are completed as you type.

    Install it once, then open a new shell:

      bash: werk completion bash > ~/.local/share/bash-completion/completions/werk

      zsh:  werk completion zsh > "${fpath[1]}/_werk"   (then run compinit)

      fish: werk completion fish > ~/.config/fish/completions/werk.fish

    Or for the current shell only: eval "$(werk completion bash)"."""
    from typer._completion_shared import get_completion_script

    typer.echo(get_completion_script(prog_name="werk", complete_var=COMPLETE_VAR, shell=shell))
