"""The plugin side of ``werk cache``: ``werk_cache_inventory`` and ``werk_cache_purge``.

In-memory plugins registered through ``get_plugin_manager(plugins=...)``: entries are validated,
a misbehaving plugin is reported and left out without hiding the others, purges go only to the
plugin that reported the entry, and a ``Conflict`` from the plugin is a skip, not a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import werk
from werk.cache.inventory import CacheKind, Filters, collect, select
from werk.cache.purge import SkipReason, execute, plan_all, plan_one
from werk.protocol import NotFound


class Owner:
    """Reports two entries and deletes them on request (recording the calls)."""

    def __init__(self, *, busy: bool = False, decline: bool = False) -> None:
        self.purged: list[tuple[Path, str]] = []
        self.busy = busy
        self.decline = decline

    @werk.hookimpl
    def werk_cache_inventory(self, home: Path) -> list[werk.CacheEntry]:
        return [
            werk.CacheEntry(id="w1", path=home / "backends" / "o" / "w1", model="m", bytes=10),
            werk.CacheEntry(id="w2", pinned=True, created_at=0.0, description="old and pinned"),
        ]

    @werk.hookimpl
    def werk_cache_purge(self, home: Path, entry_id: str) -> bool | None:
        if self.decline:
            return None
        if self.busy:
            raise werk.Conflict(f"{entry_id} became busy")
        self.purged.append((home, entry_id))
        return True


class Broken:
    @werk.hookimpl
    def werk_cache_inventory(self) -> Any:  # may omit arguments it does not need
        raise RuntimeError("disk on fire")


class WrongType:
    @werk.hookimpl
    def werk_cache_inventory(self, home: Path) -> Any:
        return [{"id": "not-an-entry"}]


class Duplicates:
    @werk.hookimpl
    def werk_cache_inventory(self, home: Path) -> Any:
        return [werk.CacheEntry(id="same"), werk.CacheEntry(id="same")]


def manager(*plugins: tuple[str, object]) -> werk.WerkPluginManager:
    return werk.get_plugin_manager(load_entrypoints=False, plugins=list(plugins), environ={})


def test_entries_are_listed_with_stable_ids_and_bad_plugins_are_reported(tmp_path: Path) -> None:
    owner = Owner()
    pm = manager(
        ("owner", owner), ("broken", Broken()), ("wrong", WrongType()), ("dup", Duplicates())
    )
    warnings: list[str] = []
    items = collect(tmp_path, pm, warn=warnings.append)
    assert [i.id for i in items] == ["worker:owner/w1", "worker:owner/w2"]
    assert items[0].location == "backends/o/w1" and items[1].location == "-"
    assert all(i.kind is CacheKind.WORKER for i in items)
    assert len(warnings) == 3
    assert any("broken" in w and "disk on fire" in w for w in warnings)
    assert any("wrong" in w and "not a werk.CacheEntry" in w for w in warnings)
    assert any("dup" in w and "duplicate" in w for w in warnings)
    assert [i.id for i in select(items, Filters(model="m"))] == ["worker:owner/w1"]
    assert [i.id for i in select(items, Filters(older_than=3600))] == ["worker:owner/w2"]


def test_purge_goes_only_to_the_owner_and_skips_pinned(tmp_path: Path) -> None:
    owner, other = Owner(), Owner()
    pm = manager(("owner", owner), ("other", other))
    items = [i for i in collect(tmp_path, pm, warn=pytest.fail) if i.id.startswith("worker:owner")]
    plan = plan_all(items, include_conversations=False)
    assert [i.id for i in plan.remove] == ["worker:owner/w1"]
    assert [(s.id, s.reason) for s in plan.skip] == [("worker:owner/w2", SkipReason.PINNED)]
    outcome = execute(plan, tmp_path, pm)
    assert outcome.removed == ["worker:owner/w1"] and outcome.failed == []
    assert owner.purged == [(tmp_path, "w1")] and other.purged == []
    with pytest.raises(NotFound):
        plan_one(items, "worker:owner/w9")


def test_a_plugin_conflict_is_a_skip_and_a_decline_a_failure(tmp_path: Path) -> None:
    for plugin, field in ((Owner(busy=True), "skipped"), (Owner(decline=True), "failed")):
        pm = manager(("owner", plugin))
        plan = plan_one(collect(tmp_path, pm, warn=pytest.fail), "worker:owner/w1")
        outcome = execute(plan, tmp_path, pm)
        assert outcome.removed == []
        assert len(getattr(outcome, field)) == 1, field


@pytest.mark.parametrize(
    "kwargs",
    [
        {"id": "a/b"},
        {"id": ""},
        {"id": ".hidden"},
        {"id": "ok", "bytes": -1},
        {"id": "ok", "created_at": float("nan")},
        {"id": "ok", "description": "two\nlines"},
        {"id": "ok", "model": ""},
    ],
)
def test_cache_entries_are_validated(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        werk.CacheEntry(**kwargs)
