"""Restarting a crashed oMLX worker: the first restart is immediate, later ones wait 1, 2, 4 …
30 s (``OmlxHandle._check_backoff``), answered ``unavailable`` (retryable) meanwhile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from werk_omlx.installation import Inspection, Installation
from werk_omlx.worker import OmlxHandle

import werk


def _handle() -> OmlxHandle:
    spec = werk.ModelSpec(id="m", backend="omlx", identity="sha256:" + "1" * 64)
    return OmlxHandle(
        spec=spec, model_dir=Path("/nonexistent"), installation=Installation(Path("/x"), "t"),
        inspection=Inspection("0", frozenset()), cache_on=False,
    )  # fmt: skip


def test_one_failure_restarts_at_once_and_later_ones_back_off() -> None:
    handle = _handle()
    handle._check_backoff("shared")  # never failed
    handle._failed("shared")
    handle._check_backoff("shared")  # one crash: the next request restarts at once
    handle._failed("shared")
    with pytest.raises(werk.Unavailable, match="failed 2 times in a row") as caught:
        handle._check_backoff("shared")
    assert caught.value.retryable
    count, _ = handle.failures["shared"]
    handle.failures["shared"] = (count, time.monotonic() - 1.1)  # 1 s passed
    handle._check_backoff("shared")
    for _ in range(10):
        handle._failed("shared")
    with pytest.raises(werk.Unavailable, match="next start is in 30 s"):
        handle._check_backoff("shared")  # capped at 30 s
    handle._check_backoff("key-other")  # partitions back off independently
