"""``werk runtime …``: control a running ``werk serve`` through the bundled :class:`WerkClient`.

Every command talks to one server (``--server URL``, ``$WERK_SERVER``, default
``http://127.0.0.1:11434``). The API key comes from ``$WERK_API_KEY`` or ``--api-key-file PATH``,
never from a command-line value, so it stays out of shell history and the process table.

Output conventions shared by every command here:

* ``--json`` prints the protocol response Struct as one line of JSON on stdout.
* A Werk error exits 1: ``error: <message> (<code>, capability …, request_id …)`` on stderr, or
  with ``--json`` the protocol error body on stdout. Usage errors exit 2 (click's convention).
* Colour and box drawing only when the stream is a terminal.
* Mutations preview (``dry_run: true``) unless ``--execute`` is given.

This module holds the typer sub-app and registers the commands, in the order ``--help`` lists
them. The pieces: :mod:`._common` (shared options, connection, error reporting),
:mod:`._render` (tables and consoles), :mod:`.info` (info, capabilities), :mod:`.memory`,
:mod:`.handoff` (prefill, decode), :mod:`.stats`, :mod:`.experts` and :mod:`.states`.
"""

from __future__ import annotations

import typer

from .._app import app
from . import experts, handoff, info, memory, ps, states, stats
from ._common import DEFAULT_SERVER, SERVER_ENV
from ._render import show
from .memory import render_memory

__all__ = ["DEFAULT_SERVER", "render_memory", "runtime_app", "show"]

runtime_app = typer.Typer(
    name="runtime",
    help=(
        "Control a running `werk serve` through its /werk/v1 API: server info, the capability "
        "matrix, live memory, named states, prefill/decode and expert residency.\n\n"
        f"The server is --server URL (or ${SERVER_ENV}; default {DEFAULT_SERVER}). The API key "
        "is read from $WERK_API_KEY or --api-key-file PATH, never from a command-line value. "
        "Every listing takes --json (the protocol response, one line). Commands that change "
        "something preview by default and act only with --execute.\n\n"
        "Exit codes: 0 success, 1 an error the server or client reported "
        "(`error: <message> (<code>, …)`), 2 a usage error. `werk plugins` and "
        "`werk capabilities` describe the local installation without a server."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(runtime_app, name="runtime")

runtime_app.command()(info.info)
runtime_app.command("capabilities")(info.capabilities_command)
runtime_app.command()(memory.memory)
runtime_app.command()(stats.stats)
runtime_app.command()(handoff.prefill)
runtime_app.command()(handoff.decode)
runtime_app.add_typer(experts.experts_app, name="experts")
runtime_app.add_typer(states.states_app, name="states")
app.command("ps")(ps.ps)  # top level, as `ollama ps` and `docker ps`
