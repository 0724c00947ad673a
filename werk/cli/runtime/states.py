"""``werk runtime states …``: list, inspect, prune, pin and move the caller's named states.

Every mutation (prune, pin, tier) is sent with ``dry_run: true`` unless ``--execute`` is given,
so the default is always a preview computed by the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer

from ...protocol import (
    PinRequest,
    PinResult,
    PruneFilter,
    PruneRequest,
    PruneResult,
    StateList,
    StateSummary,
    Tier,
    TierRequest,
    TierResult,
)
from ...protocol.durations import parse_duration_seconds
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    ExecuteOpt,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    model_option,
    respond,
)
from ._render import show, size, table

__all__ = ["STATE_COLUMNS", "build_prune", "parse_duration", "state_rows", "states_app"]

MAX_OLDER_THAN_SECONDS = 10 * 365 * 86400  # PruneFilter.older_than_seconds bound

states_app = typer.Typer(
    name="states",
    help=(
        "The caller's named states on the server (only your principal's). `list` and `inspect` "
        "are read-only; `prune`, `pin` and `tier` preview unless --execute."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)


STATE_COLUMNS = (
    "ID",
    "MODEL",
    "TIER",
    "STATUS",
    "SIZE",
    "CREATED",
    "LAST USED",
    "EXPIRES",
    "PINNED",
    "REUSABLE",
)


def state_rows(states: Sequence[StateSummary]) -> list[list[Any]]:
    """Table rows for state summaries (see :data:`STATE_COLUMNS`)."""
    return [
        [
            s.id,
            s.model,
            s.tier.value,
            s.status.value,
            size(s.logical_bytes),
            s.created_at,
            s.last_accessed_at,
            s.expires_at or "never",
            s.pinned,
            s.reusable,
        ]
        for s in states
    ]


def parse_duration(text: str) -> int:
    """``3600``, ``3600s``, ``30m``, ``1h``, ``2d`` or a sum like ``1h30m`` → seconds.

    :raises typer.BadParameter: for anything else or more than ten years (usage error, exit 2).
    """
    try:
        exact = parse_duration_seconds(text)
    except ValueError:
        exact = -1.0
    if exact < 0 or exact != int(exact):  # whole seconds only
        raise typer.BadParameter(
            f"{text!r} is not a duration (e.g. 3600, 3600s, 30m, 1h, 2d, 1h30m)",
            param_hint="--older-than",
        )
    seconds = int(exact)
    if seconds > MAX_OLDER_THAN_SECONDS:
        raise typer.BadParameter("at most ten years", param_hint="--older-than")
    return seconds


StateIdArg = Annotated[str, typer.Argument(metavar="ID", help="A state id (st_…).")]


@states_app.command("list")
def list_states(
    model: Annotated[str | None, model_option("Only this model's states.")] = None,
    tier: Annotated[Tier | None, typer.Option("--tier", help="Only states in this tier.")] = None,
    pinned: Annotated[
        bool | None,
        typer.Option(
            "--pinned/--unpinned", help="Only pinned (or only unpinned) states.", show_default=False
        ),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """List your ready states (GET /werk/v1/states). Read-only: nothing is created, repaired,
    touched or expired by listing. `reusable` means a live runtime could resume from it now."""
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.list_states(model=model, tier=tier, pinned=pinned),
        _print_states,
    )


def _print_states(listing: StateList) -> None:
    if not listing.states:
        show("No states.")
        return
    show(table("States", STATE_COLUMNS, state_rows(listing.states)))


@states_app.command()
def inspect(
    state_id: StateIdArg,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show one state (GET /werk/v1/states/ID). Read-only. A state that is unknown, expired or
    owned by someone else is `not_found` (the server never says which)."""
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.inspect_state(state_id),
        _print_state,
    )


def _print_state(summary: StateSummary) -> None:
    row = state_rows([summary])[0]
    show(table(None, ("", ""), list(zip(STATE_COLUMNS, row, strict=True))))


def build_prune(
    *,
    ids: list[str],
    model: str | None,
    tier: Tier | None,
    older_than: str | None,
    expired: bool,
    all_states: bool,
    execute: bool,
) -> PruneRequest:
    """Exactly one selector: ids, a filter (its members combine: all must match), or all."""
    has_filter = model is not None or tier is not None or older_than is not None or expired
    if sum((bool(ids), has_filter, all_states)) != 1:
        raise typer.BadParameter(
            "choose what to prune with exactly one of: --id ID (repeatable); filters "
            "--model/--tier/--older-than/--expired (combinable, a state must match all); --all",
            param_hint="'--id' / filters / '--all'",
        )
    if all_states:
        return PruneRequest(all=True, confirm="all", dry_run=not execute)
    if ids:
        return PruneRequest(ids=ids, dry_run=not execute)
    return PruneRequest(
        filter=PruneFilter(
            model=model,
            tier=tier,
            older_than_seconds=None if older_than is None else parse_duration(older_than),
            expired=True if expired else None,
        ),
        dry_run=not execute,
    )


@states_app.command()
def prune(
    ids: Annotated[
        list[str] | None,
        typer.Option("--id", metavar="ID", help="Prune this state (repeatable)."),
    ] = None,
    model: Annotated[str | None, model_option("Filter: this model's states.")] = None,
    tier: Annotated[
        Tier | None, typer.Option("--tier", help="Filter: states in this tier.")
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            metavar="DURATION",
            help="Filter: created at least this long ago (3600, 3600s, 30m, 1h, 2d, 1h30m).",
        ),
    ] = None,
    expired: Annotated[
        bool, typer.Option("--expired", help="Filter: states past their TTL.")
    ] = False,
    all_states: Annotated[
        bool,
        typer.Option("--all", help="Every state you own (sends the separate confirm: all)."),
    ] = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Delete states (POST /werk/v1/states/prune). PREVIEWS unless --execute.

    Select with --id (repeatable), with filters (--model, --tier, --older-than, --expired; a
    state must match every filter given), or with --all. The preview lists what would be
    deleted and what would be skipped: pinned states and states with a live handoff are never
    deleted. Run the same command again with --execute to delete.
    """
    request = build_prune(
        ids=list(ids or []),
        model=model,
        tier=tier,
        older_than=older_than,
        expired=expired,
        all_states=all_states,
        execute=execute,
    )
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.prune_states(request),
        _print_prune,
    )


def _print_prune(result: PruneResult) -> None:
    skipped = {s.id: s.reason.value for s in result.skipped}
    deleted = set(result.deleted)
    rows: list[tuple[Any, ...]] = []
    for state_id in result.selected:
        if state_id in skipped:
            action = f"skipped: {skipped[state_id]}"
        elif state_id in deleted:
            action = "deleted"
        elif result.dry_run:
            action = "would delete"
        else:
            action = "not deleted"
        rows.append((state_id, action))
    if not rows:
        show("No states matched.")
        return
    show(table("Prune", ("ID", "ACTION"), rows))
    if result.dry_run:
        would = len(result.selected) - len(skipped)
        show(
            f"Preview: {would} state(s) would be deleted, {len(skipped)} skipped. "
            "Run again with --execute to delete."
        )
    else:
        show(f"Deleted {len(result.deleted)} state(s), {len(skipped)} skipped.")


@states_app.command()
def pin(
    state_id: StateIdArg,
    unpin: Annotated[bool, typer.Option("--unpin", help="Remove the pin instead.")] = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Pin a state (or --unpin it) (POST /werk/v1/states/ID/pin). PREVIEWS unless --execute.

    A pinned state is never pruned, demoted or evicted by pressure relief. The preview shows
    the state as it would look afterwards.
    """
    request = PinRequest(pinned=not unpin, dry_run=not execute)
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.pin_state(state_id, request),
        lambda result: _print_pin(result, unpin),
    )


def _print_pin(result: PinResult, unpin: bool) -> None:
    verb = "unpin" if unpin else "pin"
    if result.dry_run:
        show(f"Preview: would {verb} {result.state.id}. Run again with --execute to {verb} it.")
    else:
        show(f"{verb}ned {result.state.id}")
    show(table(None, ("", ""), [("pinned", result.state.pinned)]))


@states_app.command("tier")
def tier_command(
    state_id: StateIdArg,
    target: Annotated[Tier, typer.Option("--target", help="The tier to move the state to.")],
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Move a state to another tier: disk, ram, vram or backend (POST /werk/v1/states/ID/tier).
    PREVIEWS unless --execute.

    The preview never creates or changes backend state; an adapter that cannot estimate a move
    without side effects answers `unsupported` and names the tier's capability.
    """
    request = TierRequest(target=target, dry_run=not execute)
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.tier_state(state_id, request),
        lambda result: _print_tier(result, target),
    )


def _print_tier(result: TierResult, target: Tier) -> None:
    if result.dry_run:
        show(
            f"Preview: would move {result.state.id} from {result.state.tier.value} to "
            f"{target.value} (estimated {size(result.estimated_bytes)}). "
            "Run again with --execute to move it."
        )
    else:
        show(f"moved {result.state.id}; now in tier {result.state.tier.value}")
