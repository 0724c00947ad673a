"""``werk runtime experts …``: list, prefetch and evict a mixture-of-experts model's experts.

``prefetch`` and ``evict`` are sent with ``dry_run: true`` unless ``--execute`` is given. An
adapter without expert control answers ``unsupported`` and names the capability.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from ...protocol import ExpertActionRequest, ExpertActionResult, ExpertList, ExpertTier
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

if TYPE_CHECKING:
    from ...client import WerkClient

__all__ = ["experts_app"]

experts_app = typer.Typer(
    name="experts",
    help=(
        "Expert residency of a mixture-of-experts model. `werk runtime experts --model ID` "
        "lists the experts the backend observed (tier, size, hotness, pin); `prefetch` and "
        "`evict` move them and preview unless --execute. An adapter without expert control "
        "answers `unsupported` and names the capability (runtime.experts.residency)."
    ),
    invoke_without_command=True,
    rich_markup_mode=None,
)

ExpertsArg = Annotated[
    list[str], typer.Argument(metavar="EXPERT...", help="Expert ids (see `experts --model`).")
]
ExpertModelOpt = Annotated[str, model_option("The model.")]
TargetOpt = Annotated[ExpertTier, typer.Option("--target", help="The tier to move the experts to.")]
AllowExperimentalOpt = Annotated[
    bool,
    typer.Option("--allow-experimental", help="Opt in when expert residency is `experimental`."),
]


@experts_app.callback()
def experts(
    ctx: typer.Context,
    model: Annotated[str | None, model_option("The model to list.")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """List a model's experts (GET /werk/v1/experts?model=ID), or run a sub-command."""
    if ctx.invoked_subcommand is not None:
        given = [
            name
            for name in ("model", "server", "api_key_file", "timeout", "as_json")
            if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
        ]
        if given:
            raise typer.BadParameter(
                f"put options after the sub-command: `werk runtime experts "
                f"{ctx.invoked_subcommand} --model ID …`",
                ctx=ctx,
                param_hint="'experts'",
            )
        return
    if model is None:
        raise typer.BadParameter(
            "give --model ID, or a sub-command (prefetch, evict)", ctx=ctx, param_hint="'--model'"
        )
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.experts(model),
        _print_experts,
    )


def _print_experts(listing: ExpertList) -> None:
    if not listing.experts:
        show(f"No experts observed for {listing.model}.")
        return
    show(
        table(
            f"Experts of {listing.model}",
            ("ID", "TIER", "SIZE", "HOTNESS", "PINNED"),
            [
                (e.id, e.tier.value, size(e.bytes), f"{e.hotness:.3f}", e.pinned)
                for e in listing.experts
            ],
        )
    )


def _expert_action(
    action: Literal["prefetch", "evict"],
    *,
    model: str,
    expert_ids: list[str],
    target: ExpertTier,
    allow_experimental: bool,
    execute: bool,
    conn: Connection,
    as_json: bool,
) -> None:
    """What ``prefetch`` and ``evict`` share: one expert action request, then its result."""

    def call(client: WerkClient) -> ExpertActionResult:
        request = ExpertActionRequest(
            experts=expert_ids,
            target=target,
            dry_run=not execute,
            allow_experimental=allow_experimental,
        )
        return client.expert_action(model, action, request)

    respond(conn, as_json, call, lambda result: _print_expert_result(action, result))


def _print_expert_result(action: str, result: ExpertActionResult) -> None:
    rows: list[tuple[Any, ...]] = [
        (a.id, a.from_.value, a.to.value, "planned") for a in result.planned
    ]
    rows += [(a.id, a.from_.value, a.to.value, "applied") for a in result.applied]
    rows += [(s.id, None, None, f"skipped: {s.reason}") for s in result.skipped]
    if rows:
        show(table(f"Expert {action}", ("ID", "FROM", "TO", "RESULT"), rows))
    else:
        show(f"Nothing to {action}.")
    if result.dry_run:
        show("Preview only: nothing was moved. Run again with --execute to apply.")


@experts_app.command()
def prefetch(
    expert_ids: ExpertsArg,
    model: ExpertModelOpt,
    target: TargetOpt = ExpertTier.RAM,
    allow_experimental: AllowExperimentalOpt = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Move experts into a faster tier (POST /werk/v1/experts/ID/prefetch).

    Previews the plan (planned moves and skips) unless --execute. Needs --allow-experimental
    while the capability is experimental.
    """
    _expert_action(
        "prefetch",
        model=model,
        expert_ids=expert_ids,
        target=target,
        allow_experimental=allow_experimental,
        execute=execute,
        conn=Connection(server, api_key_file, timeout),
        as_json=as_json,
    )


@experts_app.command()
def evict(
    expert_ids: ExpertsArg,
    model: ExpertModelOpt,
    target: TargetOpt = ExpertTier.RAM,
    allow_experimental: AllowExperimentalOpt = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Move experts out to a slower tier (POST /werk/v1/experts/ID/evict).

    Previews the plan (planned moves and skips) unless --execute. Pinned experts are skipped.
    Needs --allow-experimental while the capability is experimental.
    """
    _expert_action(
        "evict",
        model=model,
        expert_ids=expert_ids,
        target=target,
        allow_experimental=allow_experimental,
        execute=execute,
        conn=Connection(server, api_key_file, timeout),
        as_json=as_json,
    )
