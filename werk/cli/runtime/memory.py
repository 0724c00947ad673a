"""``werk runtime memory``: one memory snapshot, or a refreshing view with ``--watch``."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ...protocol import MemoryResponse, PressureLevel
from .._output import emit_json
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    connect,
)
from ._render import console, show, size, table

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ...client import WerkClient

__all__ = ["memory", "render_memory"]

_PRESSURE_STYLE = {
    PressureLevel.NORMAL: "green",
    PressureLevel.SOFT: "yellow",
    PressureLevel.HARD: "red",
    PressureLevel.EMERGENCY: "bold red",
    PressureLevel.UNKNOWN: "dim",
}


def render_memory(m: MemoryResponse, note: str | None = None) -> RenderableType:
    """The memory view: one row per resource, then Werk's accounting and counters."""
    from rich.console import Group
    from rich.text import Text

    title = f"Memory at {m.sampled_at}" + (f"  ({note})" if note else "")
    rows: list[tuple[Any, ...]] = []
    if m.host is None:
        rows.append(("host", "not observed", "not observed", "not observed"))
    else:
        h = m.host
        rows.append(("host", size(h.total_bytes), size(h.used_bytes), size(h.available_bytes)))
    if m.accelerators is None:
        rows.append(("accelerators", "could not sample", None, None))
    elif not m.accelerators:
        rows.append(("accelerators", "none present", None, None))
    for a in m.accelerators or []:
        free = (
            None if a.total_bytes is None or a.used_bytes is None else a.total_bytes - a.used_bytes
        )
        rows.append(
            (
                f"gpu{a.index} {a.name}",
                size(a.total_bytes, "not observed"),
                size(a.used_bytes, "not observed"),
                size(free, "not observed"),
            )
        )
    resources = table(title, ("RESOURCE", "TOTAL", "USED", "AVAILABLE"), rows)
    c = m.counters
    accounting = table(
        None,
        ("", ""),
        [
            ("pressure", Text(m.pressure.value, style=_PRESSURE_STYLE.get(m.pressure, ""))),
            ("unified memory", m.unified),
            ("managed allocated", size(m.managed.allocated_bytes)),
            ("managed reserved", size(m.managed.reserved_bytes)),
            ("failed_releases", c.failed_releases),
            ("orphaned_release_bytes", c.orphaned_release_bytes),
            ("telemetry_errors", c.telemetry_errors),
            ("backend_cleanup_failures", c.backend_cleanup_failures),
            ("backend_cleanup_latched", c.backend_cleanup_latched),
        ],
    )
    return Group(resources, Text(""), accounting)


def memory(
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep refreshing, like `top` (Ctrl+C to quit).")
    ] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            min=0.05,
            max=3600.0,
            metavar="SECONDS",
            help="Seconds between samples with --watch [default: 2].",
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, metavar="N", help="With --watch: stop after N samples."),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show host and accelerator memory, Werk's managed allocations and reservations, the
    pressure level and the failure counters (GET /werk/v1/memory).

    `not observed` means Werk could not measure it (never shown as zero). With --watch the view
    refreshes in place on a terminal; when stdout is not a terminal one snapshot (a table, or
    one JSON line with --json) is printed per interval. --count N stops after N snapshots;
    Ctrl+C stops cleanly with exit status 0.
    """
    if not watch and (interval is not None or count is not None):
        raise typer.BadParameter(
            "--interval and --count only apply together with --watch", param_hint="'--watch'"
        )
    period = 2.0 if interval is None else interval
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        if not watch:
            _print_memory_once(client.memory(), as_json)
            return
        try:
            if sys.stdout.isatty() and not as_json:
                _watch_live(client, period, count)
            else:
                _watch_lines(client, period, count, as_json)
        except KeyboardInterrupt:
            return


def _print_memory_once(m: MemoryResponse, as_json: bool) -> None:
    if as_json:
        emit_json(m)
    else:
        show(render_memory(m))


def _watch_lines(client: WerkClient, period: float, count: int | None, as_json: bool) -> None:
    """Off a terminal (or with --json): one snapshot per interval, appended."""
    shown = 0
    while True:
        _print_memory_once(client.memory(), as_json)
        if not as_json:
            sys.stdout.write("\n")
        sys.stdout.flush()
        shown += 1
        if count is not None and shown >= count:
            return
        time.sleep(period)


def _watch_live(client: WerkClient, period: float, count: int | None) -> None:
    """On a terminal: the view redrawn in place, like `top`."""
    from rich.live import Live

    note = f"every {period:g}s, Ctrl+C to quit"
    shown = 1
    first = render_memory(client.memory(), note)
    with Live(first, console=console(), auto_refresh=False) as live:
        live.refresh()
        while count is None or shown < count:
            time.sleep(period)
            live.update(render_memory(client.memory(), note), refresh=True)
            shown += 1
