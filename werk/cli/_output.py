"""Terminal output: JSON for scripts, plain tables for people, one way to report errors."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import typer

from ..protocol import WerkError, encode

__all__ = ["emit_json", "plain_table", "print_table", "reporting_errors"]


def emit_json(value: Any) -> None:
    """Write ``value`` (a Struct or builtins) as one line of JSON to stdout."""
    sys.stdout.write(encode(value).decode() + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A readable table; colour and box drawing only when stdout is a terminal.

    The width is the terminal's, or ``COLUMNS`` when set; a pipe without ``COLUMNS`` gets
    unwrapped lines (up to 400 columns) for tools like ``grep``. Cells past the width wrap."""
    tty = sys.stdout.isatty()
    sized = tty or os.environ.get("COLUMNS", "").isdigit()
    cells = [[("-" if cell is None else str(cell)) for cell in row] for row in rows]
    if not sized:
        plain = plain_table(title, columns, cells)
        if plain is not None:
            sys.stdout.write(plain)
            return
    from rich.console import Console  # imported when used: every `werk` command loads this module
    from rich.table import Table

    console = Console(
        no_color=not tty,
        width=None if sized else PIPE_WIDTH,
        soft_wrap=False,
        markup=False,  # a model id like "[x]" is text, not a style
        emoji=False,
    )
    table = Table(title=title, title_justify="left", show_lines=False, box=None, pad_edge=False)
    for index, column in enumerate(columns):
        table.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in cells:
        table.add_row(*row)
    console.print(table)


_OWN_SYMBOLS = frozenset("…")
"""Non-ASCII characters Werk's own tables print (a shortened identity), one cell wide."""


def _plain(text: str) -> bool:
    """Printable ASCII or Werk's own symbols: one terminal cell per character, as rich counts
    (anything else, from other scripts to emoji, is left to rich's cell widths)."""
    return text.isprintable() and all(c.isascii() or c in _OWN_SYMBOLS for c in text)


PIPE_WIDTH = 400
"""A pipe without ``COLUMNS`` gets lines up to this wide (wider rows wrap, through rich)."""


def plain_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str | None:
    """The text rich prints for this table into a pipe (no colour, no box, left-justified
    columns two spaces apart), made without importing rich (~25 ms); ``None`` when rich must
    render it: text other than printable ASCII and ``…`` (terminal cell widths) or a row wider
    than :data:`PIPE_WIDTH`."""
    texts = [title, *columns, *(cell for row in rows for cell in row)]
    if not all(_plain(text) for text in texts):
        return None
    widths = [len(column) for column in columns]
    for row in rows:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    total = sum(widths) + 2 * (len(widths) - 1)
    if total > PIPE_WIDTH or len(title) > total:
        return None
    lines = [title.ljust(total)] if title else []
    for row in (columns, *rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    return "\n".join(lines) + "\n"


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
