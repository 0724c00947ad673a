"""The live states persisted chat turns were kept from (:class:`werk.control.live_kept.LiveKept`):
offered once, only to the principal and process generation they belong to, bounded."""

from __future__ import annotations

import pytest

from werk.backends import BackendState, StateKind
from werk.control.live_kept import LiveKept


def live(generation: str = "g_1", tokens: int = 10) -> BackendState:
    return BackendState(
        kind=StateKind.HANDLE, handle=object(), generation=generation, tokens=tokens
    )


def test_a_remembered_state_is_offered_once() -> None:
    kept = LiveKept()
    state = live()
    kept.remember("p_a", "st_1", state)
    assert kept.take("p_a", "st_1", "g_1") is state
    assert kept.take("p_a", "st_1", "g_1") is None  # continuing it changed what it holds
    assert len(kept) == 0


def test_only_the_principal_that_kept_it_finds_it() -> None:
    kept = LiveKept()
    kept.remember("p_a", "st_1", live())
    assert kept.take("p_b", "st_1", "g_1") is None
    assert kept.take("p_a", "st_1", "g_1") is not None


def test_a_state_of_another_process_generation_is_not_offered_and_is_forgotten() -> None:
    kept = LiveKept()
    kept.remember("p_a", "st_1", live("g_old"))
    assert kept.take("p_a", "st_1", "g_new") is None
    assert len(kept) == 0


def test_ended_generations_are_dropped() -> None:
    kept = LiveKept()
    kept.remember("p_a", "st_1", live("g_old"))
    kept.remember("p_a", "st_2", live("g_new"))
    kept.drop_generations({"g_new"})
    assert len(kept) == 1
    assert kept.take("p_a", "st_2", "g_new") is not None


def test_past_the_limit_the_oldest_is_forgotten() -> None:
    kept = LiveKept(limit=2)
    for n in range(3):
        kept.remember("p_a", f"st_{n}", live())
    kept.remember("p_a", "st_1", live())  # remembered again: now the newest
    kept.remember("p_a", "st_3", live())
    assert len(kept) == 2
    assert kept.take("p_a", "st_0", "g_1") is None
    assert kept.take("p_a", "st_2", "g_1") is None
    assert kept.take("p_a", "st_1", "g_1") is not None
    assert kept.take("p_a", "st_3", "g_1") is not None


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        LiveKept(limit=0)
