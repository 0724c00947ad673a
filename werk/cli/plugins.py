"""``werk plugins``: the installed plugins, and ``werk plugins new`` for a plugin of your own."""

from __future__ import annotations

from pathlib import Path

import typer

from ._app import app
from ._output import emit_json, print_table, reporting_errors

JSON_HELP = "Print machine-readable JSON instead of a table."

plugins_app = typer.Typer(
    help=(
        "List installed plugins (`werk plugins`), or write a new backend plugin "
        "(`werk plugins new NAME`)."
    ),
    invoke_without_command=True,
    no_args_is_help=False,
    rich_markup_mode=None,
)
app.add_typer(plugins_app, name="plugins")


@plugins_app.callback()
def plugins(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Also print the full traceback of every failed plugin."
    ),
) -> None:
    """List installed plugins: status, version, backends, and the hooks each implements.

    A plugin that failed to import or register is listed as `failed` with its error (and a
    one-line warning on stderr); the others keep working. `-v` shows the traceback. Restrict
    loading with WERK_LOAD_PLUGINS=name1,name2 (empty: none); trace hook calls with
    WERK_TRACE_PLUGINS=1.

    `werk plugins new NAME` writes a ready-to-install plugin of your own.
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..plugins import get_plugin_manager

    pm = get_plugin_manager()
    rows = pm.plugin_rows()
    if verbose:
        for record in pm.records.values():
            if record.traceback:
                typer.echo(f"plugin {record.name} failed:\n{record.traceback}", err=True)
    if as_json:
        emit_json({"plugins": rows})
        return
    if not rows:
        typer.echo(
            "No plugins loaded. Install one, e.g. `pip install werk-llamacpp`, or write your "
            "own: `werk plugins new NAME`."
        )
        return
    print_table(
        "Plugins",
        ["NAME", "VERSION", "STATUS", "BACKENDS", "HOOKS", "ERROR"],
        [
            (
                r.name,
                r.version,
                r.status,
                ",".join(r.backends),
                ",".join(h.removeprefix("werk_") for h in r.hooks),
                r.error,
            )
            for r in rows
        ],
    )


@plugins_app.command("new")
def new(
    name: str = typer.Argument(
        ...,
        metavar="NAME",
        help="The backend name: lowercase letters and digits, '-' or '_' between them (acme).",
    ),
    directory: Path | None = typer.Option(
        None,
        "--directory",
        "-d",
        help="Where to write the plugin (default: ./NAME). Must not exist, or be empty.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Write a ready-to-install backend plugin NAME: the plugin guide's tutorial, renamed.

    It is a complete backend (an in-process "model" that repeats the prompt) with /v1 chat and
    text completions, split prefill/decode, named states that survive on disk, a functional
    probe behind every `experimental` row, a pyproject.toml registering it in the `werk`
    entry-point group, a README, and a test running the conformance kit. Replace the model,
    keep the kit green:

        werk plugins new acme
        pip install -e './acme[test]'
        python -m werk.testing --backend acme      # exit status 0: every check passed
    """
    from ..plugin_template import validate_plugin_name, write_plugin
    from ..plugins import get_plugin_manager
    from ..protocol import Conflict

    target = directory if directory is not None else Path(name)
    with reporting_errors(as_json):
        validate_plugin_name(name)
        pm = get_plugin_manager()
        if name in pm.backends:
            owner = pm.owner_of(name).name
            raise Conflict(
                f"backend {name!r} is already registered by the installed plugin {owner!r}; "
                "pick another name"
            )
        made = write_plugin(name, target)
    if as_json:
        emit_json(
            {
                "name": made.name,
                "distribution": made.distribution,
                "module": made.module,
                "directory": str(made.directory.absolute()),
                "files": [str(p.relative_to(made.directory)) for p in made.files],
            }
        )
        return
    shown = str(target) if target.is_absolute() else f"./{target}"
    typer.echo(f"Wrote plugin {made.distribution} (backend {name!r}) to {shown}:")
    for path in made.files:
        typer.echo(f"  {path.relative_to(made.directory)}")
    typer.echo(
        "\nNext:\n"
        f"  pip install -e '{shown}[test]'\n"
        f"  python -m werk.testing --backend {name}\n"
        f"  pytest {shown}"
    )
