"""Terminal rendering for ``werk runtime``: consoles, borderless tables and sizes.

Colour and box drawing only when the stream is a terminal; off a terminal the output is plain
text without trailing blanks, so scripts and tests can compare it line by line. (The
installation-level :func:`werk.cli._output.print_table` keeps rich's highlighting and trailing
padding, so it is not used here.)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..._units import format_bytes

if TYPE_CHECKING:  # rich is imported when something is rendered, not with every `werk` command
    from rich.console import Console, RenderableType
    from rich.table import Table

__all__ = ["console", "show", "size", "table"]


def console(stream: TextIO | None = None) -> Console:
    """A console on ``stream`` (stdout by default): colour only when it is a terminal."""
    from rich.console import Console

    out = stream if stream is not None else sys.stdout
    tty = out.isatty()
    return Console(
        file=out,
        no_color=not tty,
        width=None if tty else 400,
        soft_wrap=False,
        highlight=False,
        markup=False,
    )


def show(renderable: RenderableType | str, stream: TextIO | None = None) -> None:
    """Print ``renderable``; off a terminal, without colour and without trailing blanks."""
    out = stream if stream is not None else sys.stdout
    target = console(out)
    if out.isatty():
        target.print(renderable)
        return
    with target.capture() as captured:
        target.print(renderable)
    out.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    out.flush()


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A plain, borderless table. ``None`` cells show as ``-``; rich ``Text`` keeps its style."""
    from rich.table import Table

    result = Table(
        title=title,
        title_justify="left",
        box=None,
        pad_edge=False,
        show_header=any(columns),
    )
    for index, column in enumerate(columns):
        result.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        result.add_row(*(_cell(cell) for cell in row))
    return result


def _cell(value: Any) -> RenderableType:
    from rich.text import Text

    if isinstance(value, Text):
        return value
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def size(value: int | None, unknown: str = "unknown") -> str:
    """``1.5 GiB``-style size; ``None`` is ``unknown`` (never shown as zero)."""
    return unknown if value is None else format_bytes(value)
