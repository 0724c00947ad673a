"""When the worker gets oMLX's prefix cache (the seed's rule), and what verified reuse reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from werk_omlx.reuse import normalize_usage, worker_cached_tokens
from werk_omlx.worker import cache_enabled, generated_flags

from werk import PersistenceDefaults, Retention, Reuse


@pytest.mark.parametrize(
    ("persistence", "on"),
    [
        (None, False),  # no --persistence
        (PersistenceDefaults(), True),  # auto, prefer
        (PersistenceDefaults(retention=Retention.DISK), True),
        (PersistenceDefaults(reuse=Reuse.REQUIRED), True),
        (PersistenceDefaults(retention=Retention.MEMORY), False),
        (PersistenceDefaults(retention=Retention.EPHEMERAL), False),
        (PersistenceDefaults(reuse=Reuse.DISABLED), False),
    ],
)
def test_auto_or_disk_with_reuse_turns_the_prefix_cache_on(
    persistence: PersistenceDefaults | None, on: bool
) -> None:
    assert cache_enabled(persistence) is on
    flags = generated_flags(on, Path("/base"))
    if on:
        assert flags == [
            "--paged-ssd-cache-dir", "/base/cache/prefix-cache",
            "--paged-ssd-cache-max-size", "4GB",
        ]  # fmt: skip
    else:
        assert flags == ["--no-cache"]


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_tokens": 9}, None),
        ({"cached_tokens": 7}, 7),
        ({"prompt_tokens_details": {"cached_tokens": 5}}, 5),
        ({"cached_tokens": 7, "prompt_tokens_details": {"cached_tokens": 5}}, 5),  # the smaller
        ({"cached_tokens": None, "prompt_tokens_details": {"cached_tokens": 3}}, 3),
        ({"cached_tokens": True}, None),
        ({"cached_tokens": -1}, None),
        ({"prompt_tokens_details": "x"}, None),
    ],
)
def test_both_positions_are_read_and_answered_in_openais_shape(
    usage: dict[str, object], cached: int | None
) -> None:
    assert worker_cached_tokens(usage) == cached
    normalized = dict(usage)
    assert normalize_usage(normalized) == (cached or 0)
    assert "cached_tokens" not in normalized
    assert normalized["prompt_tokens_details"] == {"cached_tokens": cached or 0}
