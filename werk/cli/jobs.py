"""``werk jobs list`` and ``werk jobs show ID``: durable media job records under
``WERK_HOME/jobs``, read locally (no server needed).

Whoever can read ``WERK_HOME`` owns every principal's jobs, so these commands show all of them
with their principal (the namespaced id, never an API key); a server shows each API key only
its own (``GET /v1/jobs``). Exit codes: 0 success, 1 an error (an unknown job), 2 a usage error.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..protocol import JobRecord, NotFound
from ._app import app
from ._output import emit_json, print_table, reporting_errors

if TYPE_CHECKING:
    from ..state.jobs import JobStore

__all__ = ["jobs_app"]

jobs_app = typer.Typer(
    help="List and show the durable media jobs of this WERK_HOME (async speech and image "
    "requests): status, output, error. Read locally; no server is needed.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(jobs_app, name="jobs")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _store() -> JobStore:
    from ..config import werk_home
    from ..state.jobs import JobStore  # imported when used: every `werk` command loads this module

    return JobStore(werk_home(), clock=time.time)


@jobs_app.command("list")
def list_jobs(as_json: JsonOpt = False) -> None:
    """Every job record, oldest first."""
    with reporting_errors(as_json):
        found = _store().every_record()
    if as_json:
        emit_json({"jobs": [{"principal": p, **_fields(r)} for p, r in found]})
        return
    if not found:
        typer.echo('No jobs. Media requests with "async": true create them.')
        return
    print_table(
        "Jobs",
        ["ID", "KIND", "STATUS", "CREATED", "UPDATED", "OUTPUT", "PRINCIPAL"],
        [
            (
                r.id,
                r.kind,
                r.status.value,
                r.created_at,
                r.updated_at,
                f"{r.output.content_type}, {r.output.bytes} B" if r.output else "-",
                principal,
            )
            for principal, r in found
        ],
    )


@jobs_app.command("show")
def show_job(
    job_id: Annotated[str, typer.Argument(metavar="ID", help="A job id (job_…).")],
    as_json: JsonOpt = False,
) -> None:
    """One job record, whole."""
    with reporting_errors(as_json):
        match = [(p, r) for p, r in _store().every_record() if r.id == job_id]
        if not match:
            raise NotFound(f"no job {job_id!r} in this WERK_HOME")
    principal, record = match[0]
    if as_json:
        emit_json({"principal": principal, **_fields(record)})
        return
    for key, value in {"principal": principal, **_fields(record)}.items():
        shown = value if isinstance(value, str) else json.dumps(value)
        typer.echo(f"{key}: {shown}")


def _fields(record: JobRecord) -> dict[str, Any]:
    import msgspec

    fields: dict[str, Any] = msgspec.to_builtins(record)
    return fields
