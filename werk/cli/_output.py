"""Terminal output: JSON for scripts, plain tables for people, one way to report errors."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer

from ..protocol import WerkError, encode

__all__ = ["emit_json", "print_table", "reporting_errors"]


def emit_json(value: Any) -> None:
    """Write ``value`` (a Struct or builtins) as one line of JSON to stdout."""
    sys.stdout.write(encode(value).decode() + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A readable table; colour and box drawing only when stdout is a terminal.

    The width is the terminal's, or ``COLUMNS`` when set; a pipe without ``COLUMNS`` gets
    unwrapped lines (up to 400 columns) for tools like ``grep``. Cells past the width wrap."""
    from rich.console import Console  # imported when used: every `werk` command loads this module
    from rich.table import Table

    tty = sys.stdout.isatty()
    sized = tty or os.environ.get("COLUMNS", "").isdigit()
    console = Console(no_color=not tty, width=None if sized else 400, soft_wrap=False)
    table = Table(title=title, title_justify="left", show_lines=False, box=None, pad_edge=False)
    for index, column in enumerate(columns):
        table.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    console.print(table)


@contextmanager
def reporting_errors(as_json: bool) -> Iterator[None]:
    """Turn a :class:`WerkError` into a message (or a JSON error body) and exit status 1."""
    try:
        yield
    except WerkError as exc:
        if as_json:
            emit_json(exc.to_body())
        else:
            typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
