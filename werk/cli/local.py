"""Commands that describe the local installation without a running server."""

from __future__ import annotations

import typer

from .._version import PROTOCOL_VERSION
from ..protocol import CapabilitiesResponse
from ._app import app
from ._output import emit_json, print_table, reporting_errors

JSON_HELP = "Print machine-readable JSON (the protocol shape) instead of a table."


@app.command()
def plugins(
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
    """
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
        typer.echo("No plugins loaded. Install one, e.g. `pip install werk-llamacpp`.")
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


@app.command()
def capabilities(
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
    model: str | None = typer.Option(None, "--model", help="Only rows for this model id."),
) -> None:
    """Show the capability matrix composed from the installed plugins, right now.

    Imported models (`werk models list`) get per-model rows; a backend with no imported model
    reports backend-wide rows (model `-`). No runtime is started: rows that need a live
    process say so.

    Statuses are exactly: supported, unsupported, unavailable, experimental,
    externally_managed, metadata_only. Anything but `supported` carries a reason.
    """
    from ..capabilities import compose_capabilities
    from ..config import werk_home
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager

    with reporting_errors(as_json):
        pm = get_plugin_manager()
        imported = [m.spec() for m in ModelRegistry(werk_home()).manifests()]
        served = [spec for spec in imported if spec.backend in pm.backends]
        rows = compose_capabilities(pm, served, model=model)
    if as_json:
        emit_json(CapabilitiesResponse(protocol=PROTOCOL_VERSION, capabilities=rows))
        return
    print_table(
        "Capabilities",
        ["CAPABILITY", "STATUS", "BACKEND", "MODEL", "REASON"],
        [(r.id, r.status, r.backend, r.model, r.reason) for r in rows],
    )
