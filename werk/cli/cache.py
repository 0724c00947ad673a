"""``werk cache list`` and ``werk cache purge``: local disk caches under ``WERK_HOME``.

Four categories (see :mod:`werk.cache.inventory`): chat sessions (``chat:<name>``, and their
native KV data ``chat:<name>/native``), plugin-owned worker caches (``worker:<plugin>/<id>``),
managed disk states (``state:<principal dir>/<state id>``) and durable media jobs with their
outputs (``job:<job id>``). No server is needed; nothing here
removes model weights or evicts a running backend's in-memory caches.

Purges preview unless ``--execute``. A bulk purge (``--all``) keeps conversation archives unless
``--include-conversations`` and always skips entries that are active (locked by a live process)
or pinned, saying so. Exit codes: 0 success, 1 an error (or a named entry that could not be
removed), 2 a usage error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .._units import format_bytes
from ._app import app
from ._output import emit_json, print_table, reporting_errors

if TYPE_CHECKING:
    from ..cache.inventory import CacheItem, CacheKind, Filters
    from ..cache.purge import PurgePlan, Skipped

__all__ = ["cache_app"]

cache_app = typer.Typer(
    help="List and purge local disk caches: chat sessions (message archives and native KV "
    "data), plugin-owned worker caches, managed disk states and finished media jobs. Purges "
    "preview unless "
    "--execute; model weights and in-memory backend caches are never touched.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(cache_app, name="cache")

KIND_HELP = "Only this category: chat, worker, state or job."
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ModelOpt = Annotated[
    str | None, typer.Option("--model", metavar="ID", help="Only entries of this model.")
]
OlderOpt = Annotated[
    str | None,
    typer.Option(
        "--older-than",
        metavar="DURATION",
        help="Only entries unused (else: created) at least this long ago: 3600, 30m, 2h, 7d.",
    ),
]


def _kind_option() -> Any:
    return typer.Option("--kind", metavar="KIND", help=KIND_HELP)


def _filters(kind: str | None, model: str | None, older_than: str | None) -> Filters:
    from ..cache.inventory import CacheKind, Filters
    from .runtime.states import parse_duration

    chosen: CacheKind | None = None
    if kind is not None:
        try:
            chosen = CacheKind(kind)
        except ValueError:
            raise typer.BadParameter(
                f"{kind!r} is not one of chat, worker, state, job", param_hint="--kind"
            ) from None
    seconds = parse_duration(older_than) if older_than is not None else None
    return Filters(kind=chosen, model=model, older_than=seconds)


def _inventory(filters: Filters) -> list[CacheItem]:
    from ..cache.inventory import CacheKind, collect, select
    from ..config import werk_home
    from ..plugins import get_plugin_manager

    kinds = frozenset({filters.kind}) if filters.kind is not None else frozenset(CacheKind)
    items = collect(
        werk_home(),
        get_plugin_manager(),
        warn=lambda text: typer.echo(f"warning: {text}", err=True),
        kinds=kinds,
    )
    return select(items, filters, time.time())


def _size(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def _status(item: CacheItem) -> str:
    flags = []
    if item.active is not None:
        flags.append(f"active ({item.active})")
    if item.pinned:
        flags.append("pinned")
    if item.conversation:
        flags.append("conversation")
    return ", ".join(flags) or "-"


def _table(title: str, items: list[CacheItem]) -> None:
    print_table(
        title,
        ["ID", "KIND", "MODEL", "SIZE", "LAST USED", "STATUS", "DESCRIPTION"],
        [
            (
                i.id,
                i.kind.value,
                i.model,
                _size(i.bytes),
                _when(i.last_used_at if i.last_used_at is not None else i.created_at),
                _status(i),
                i.description,
            )
            for i in items
        ],
    )


@cache_app.command("list")
def list_caches(
    as_json: JsonOpt = False,
    kind: Annotated[str | None, _kind_option()] = None,
    model: ModelOpt = None,
    older_than: OlderOpt = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", min=1, max=1000, help="At most this many entries (by id)."),
    ] = None,
    cursor: Annotated[
        str | None,
        typer.Option("--cursor", help="Continue after the previous page (its `next_cursor`)."),
    ] = None,
) -> None:
    """List chat sessions, plugin worker caches, managed disk states and finished media jobs
    (with their outputs), with their ids.

    STATUS shows `active` (a live process holds it: every purge skips it), `pinned` (every
    purge skips it) and `conversation` (a message archive: `purge --all` keeps it unless
    --include-conversations). With --limit the entries come by id, a page at a time: the next
    page is `--cursor` with the `next_cursor` the previous one printed.
    """
    from ..protocol.paging import decode_cursor, page_after

    filters = _filters(kind, model, older_than)
    next_cursor: str | None = None
    with reporting_errors(as_json):
        items = _inventory(filters)
        if limit is not None or cursor is not None:
            ordered = sorted(items, key=lambda i: i.id)
            items, next_cursor = page_after(ordered, lambda i: i.id, limit, decode_cursor(cursor))
    if as_json:
        emit_json({"entries": [i.to_json() for i in items], "next_cursor": next_cursor})
        return
    if not items:
        typer.echo("No cache entries.")
        return
    total = sum(i.bytes or 0 for i in items)
    _table(f"Cache entries ({len(items)}, {_size(total)})", items)
    if next_cursor is not None:
        typer.echo(f"More entries: werk cache list --limit {limit} --cursor {next_cursor}")


@cache_app.command("purge")
def purge(
    cache_id: Annotated[
        str | None,
        typer.Argument(metavar="CACHE-ID", help="One entry id from `werk cache list`."),
    ] = None,
    purge_all: Annotated[
        bool, typer.Option("--all", help="Every entry (narrowed by --kind/--model/--older-than).")
    ] = False,
    include_conversations: Annotated[
        bool,
        typer.Option(
            "--include-conversations", help="With --all: remove conversation archives too."
        ),
    ] = False,
    execute: Annotated[
        bool, typer.Option("--execute", help="Actually remove (default: preview only).")
    ] = False,
    kind: Annotated[str | None, _kind_option()] = None,
    model: ModelOpt = None,
    older_than: OlderOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove one entry (CACHE-ID) or every entry (--all). Previews unless --execute.

    Active (locked by a live process) and pinned entries are always skipped, and --all keeps
    conversation archives unless --include-conversations; each skip is listed with its reason.
    Disk states are pruned through the state catalog (locking and fsync rules hold); plugin
    caches are deleted by the plugin that owns them.
    """
    from ..cache.purge import execute as run_purge
    from ..cache.purge import plan_all, plan_one
    from ..config import werk_home
    from ..plugins import get_plugin_manager

    if (cache_id is None) == (not purge_all):
        raise typer.BadParameter("give exactly one of CACHE-ID or --all")
    narrowed = kind is not None or model is not None or older_than is not None
    if cache_id is not None and (narrowed or include_conversations):
        raise typer.BadParameter(
            "--kind/--model/--older-than/--include-conversations only go with --all"
        )
    filters = _filters(kind, model, older_than)
    with reporting_errors(as_json):
        items = _inventory(filters)
        plan: PurgePlan
        if cache_id is not None:
            plan = plan_one(items, cache_id)
        else:
            plan = plan_all(items, include_conversations=include_conversations)
        outcome = run_purge(plan, werk_home(), get_plugin_manager()) if execute else None
    removed = outcome.removed if outcome else []
    skipped = outcome.skipped if outcome else plan.skip
    failed = outcome.failed if outcome else []
    if as_json:
        emit_json(
            {
                "executed": execute,
                "remove": [i.to_json() for i in plan.remove],
                "removed": removed,
                "skipped": [s.to_json() for s in skipped],
                "failed": [{"id": i, "reason": r} for i, r in failed],
            }
        )
    else:
        _report(plan.remove, removed, skipped, failed, execute)
    named_not_removed = cache_id is not None and execute and cache_id not in removed
    if failed or named_not_removed:
        if not as_json and named_not_removed and not failed:
            typer.echo(f"error: {cache_id} was not removed", err=True)
        raise typer.Exit(1)


def _report(
    planned: list[CacheItem],
    removed: list[str],
    skipped: list[Skipped],
    failed: list[tuple[str, str]],
    execute: bool,
) -> None:
    total = _size(sum(i.bytes or 0 for i in planned))
    if execute:
        done = [i for i in planned if i.id in set(removed)]
        if done:
            _table(f"Removed ({len(done)})", done)
        else:
            typer.echo("Nothing was removed.")
    elif planned:
        _table(f"Would remove ({len(planned)}, {total})", planned)
    else:
        typer.echo("Nothing to remove.")
    if skipped:
        print_table(
            f"{'Skipped' if execute else 'Would skip'} ({len(skipped)})",
            ["ID", "REASON", "DETAIL"],
            [(s.id, s.reason.value, s.detail) for s in skipped],
        )
    if failed:
        print_table(f"Failed ({len(failed)})", ["ID", "ERROR"], failed)
    if not execute and planned:
        typer.echo("Preview only: nothing was removed. Run again with --execute.")
