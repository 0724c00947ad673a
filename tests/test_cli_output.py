"""``werk.cli._output``: the plain table a pipe gets is byte for byte what rich prints there."""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from werk.cli import _output

ascii_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30)
any_text = st.text(st.characters(max_codepoint=0xFFFF), max_size=12)


def rendered(title: str, columns: list[str], rows: list[list[str]], *, plain: bool) -> str:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("COLUMNS", raising=False)
        if not plain:
            patch.setattr(_output, "plain_table", lambda *_: None)
        with contextlib.redirect_stdout(out):
            _output.print_table(title, columns, rows)
    return out.getvalue()


@settings(max_examples=150, deadline=None)
@given(
    title=ascii_text,
    columns=st.lists(ascii_text.filter(bool), min_size=1, max_size=6),
    data=st.data(),
)
def test_a_plain_table_is_what_rich_prints_into_a_pipe(
    title: str, columns: list[str], data: st.DataObject
) -> None:
    rows = data.draw(
        st.lists(st.lists(ascii_text, min_size=len(columns), max_size=len(columns)), max_size=5)
    )
    if _output.plain_table(title, columns, rows) is None:
        return  # rich renders it (too wide, or a title wider than the table)
    assert rendered(title, columns, rows, plain=True) == rendered(title, columns, rows, plain=False)


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(any_text, min_size=2, max_size=2))
def test_a_plain_table_of_any_narrow_text_is_what_rich_prints(cells: list[str]) -> None:
    columns = ["NAME", "VALUE"]
    if _output.plain_table("T", columns, [cells]) is None:
        return
    assert rendered("T", columns, [cells], plain=True) == rendered(
        "T", columns, [cells], plain=False
    )


def test_what_is_wide_unprintable_or_too_wide_is_left_to_rich() -> None:
    assert _output.plain_table("T", ["NAME"], [["sha256:0123…"]]) == (
        "T           \nNAME        \nsha256:0123…\n"
    )
    own = ("Models", ["ID", "IDENTITY"], [["demo", "sha256:60e3d72f7db1…"]])
    assert rendered(*own, plain=True) == rendered(*own, plain=False)
    assert _output.plain_table("T", ["NAME"], [["模型"]]) is None
    assert _output.plain_table("T", ["NAME"], [["a\tb"]]) is None
    assert _output.plain_table("T", ["NAME"], [["x" * 401]]) is None
    assert _output.plain_table("T", ["A", "B"], [["1", "22"]]) == "T    \nA  B \n1  22\n"
