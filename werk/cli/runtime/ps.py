"""``werk ps``: the runtimes a running ``werk serve`` has loaded (GET /werk/v1/runtimes)."""

from __future__ import annotations

import functools
from typing import Annotated

import typer

from ...protocol import PagePreparation, RuntimeList
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    respond,
)
from ._render import show, size, table

__all__ = ["ps"]


VerboseOpt = Annotated[
    bool,
    typer.Option(
        "--verbose",
        "-v",
        help="Also show what page preparation did before each runtime's native load.",
    ),
]


def ps(
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """List the models a running server has loaded: backend, process id, generation, age,
    work in progress, when it unloads if left idle (`werk serve --keep-alive`, or a request's
    own "keep_alive"), and memory (Werk's reservation; the process tree's resident bytes).
    Models being loaded are listed first, with their phase (reserving memory, opening files,
    starting), for how long, and how many requests wait for them."""
    respond(
        Connection(server, api_key_file, timeout),
        as_json,
        lambda client: client.runtimes(),
        functools.partial(_print, verbose=verbose),
    )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "forever"
    if seconds < 60:
        return f"{seconds:g}s"
    if seconds < 3600:
        return f"{seconds / 60:g}m"
    return f"{seconds / 3600:g}h"


def _print(listing: RuntimeList, *, verbose: bool = False) -> None:
    if listing.loading:
        show(
            table(
                "Loading",
                ["MODEL", "BACKEND", "PHASE", "FOR", "WAITING REQUESTS"],
                [
                    (r.model, r.backend, r.phase, f"{r.elapsed_seconds}s", r.waiting)
                    for r in listing.loading
                ],
            )
        )
    if not listing.runtimes:
        if not listing.loading:
            show("No model is loaded. The first request for a model starts it.")
        return
    show(
        table(
            None,
            [
                "MODEL",
                "BACKEND",
                "PID",
                "GENERATION",
                "AGE",
                "BUSY",
                "UNLOADS AT",
                "KEEP-ALIVE",
                "RESERVED",
                "OBSERVED",
            ],
            [
                (
                    r.model,
                    r.backend,
                    r.pid,
                    r.generation,
                    f"{r.age_seconds}s",
                    r.busy,
                    r.idle_until or ("when idle" if r.busy else "never"),
                    _duration(r.keep_alive_seconds),
                    size(r.reserved_bytes, "-"),
                    size(r.observed_bytes, "-"),
                )
                for r in listing.runtimes
            ],
        )
    )
    if verbose:
        for r in listing.runtimes:
            show(f"{r.model}: page preparation: {_preparation(r.preparation)}")


def _preparation(p: PagePreparation | None) -> str:
    if p is None:
        return "none (no expert tensors, or not a local process)"
    return (
        f"{p.outcome} in {p.seconds:.3f} s; checked {size(p.checked_bytes)}, missing "
        f"{size(p.missing_bytes)}, prefaulted {size(p.prefaulted_bytes)}, retained "
        f"{size(p.retained_bytes)}"
    )
