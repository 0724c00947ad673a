"""The one duration parser (werk.protocol.durations) behind --keep-alive, a /v1 keep_alive and
--older-than."""

from __future__ import annotations

import pytest

from werk.protocol.durations import parse_duration_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("2.5", 2.5),
        ("300ms", 0.3),
        ("90s", 90.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("2d", 172800.0),
        (" 1H ", 3600.0),
        ("1m500ms", 60.5),
    ],
)
def test_accepted_forms(text: str, seconds: float) -> None:
    assert parse_duration_seconds(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "-1", "5x", "1h 2m", "m", "1e3", "inf", "nan", "1.5.2s"])
def test_everything_else_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_seconds(text)
