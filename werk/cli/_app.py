"""The root typer application and the options every command shares."""

from __future__ import annotations

import typer

from .._version import PROTOCOL_VERSION, __version__
from . import _gc

app = typer.Typer(
    name="werk",
    help=(
        "Werk hosts local inference backends (llama.cpp, vLLM, oMLX, media workers) behind an "
        "OpenAI-compatible /v1 API and the Werk Protocol 1.0 control plane under /werk/v1.\n\n"
        "Start with `werk plugins` to see which backends are installed and `werk capabilities` "
        "to see what each one can truthfully do on this machine."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"werk {__version__} (protocol {PROTOCOL_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False,
        "--version",
        help="Print the version and exit.",
        callback=_version_callback,
        is_eager=True,
    ),
) -> None:
    """Werk command line."""
    if ctx.invoked_subcommand != "serve":  # serve resumes once started
        _gc.resume()
