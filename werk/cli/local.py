"""Commands that describe the local installation without a running server."""

from __future__ import annotations

import typer

from .._version import PROTOCOL_VERSION
from ..protocol import CapabilitiesResponse
from ._app import app
from ._output import emit_json, print_table, reporting_errors

JSON_HELP = "Print machine-readable JSON (the protocol shape) instead of a table."


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
