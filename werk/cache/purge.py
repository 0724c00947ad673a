"""Planning and executing ``werk cache purge`` (preview by default).

A plan splits the selected inventory into what would be removed and what is skipped, with a
reason per skipped entry:

* ``active`` — a live process holds it (a chat's ``flock``, or a plugin says so);
* ``pinned`` — kept on purpose;
* ``conversation`` — a bulk purge keeps message archives unless ``--include-conversations``.

Naming one cache id is consent for that entry, conversation or not, but never overrides
``active`` or ``pinned``. Executing acts on exactly the planned entries, each through its
owner: chat sessions through :class:`~werk.chat.archive.SessionStore` (under the session's
lock), worker caches through the owning plugin's ``werk_cache_purge``, disk states through
:meth:`StateCatalog.prune <werk.state.catalog.StateCatalog.prune>` (so the store's locking,
reconciliation, pin rule and fsync discipline hold), finished jobs through
:meth:`JobStore.remove <werk.state.jobs.JobStore.remove>`. An entry that became active or pinned
meanwhile is skipped, not forced. Model weights and in-memory backend caches are never touched.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..plugins import WerkPluginManager
from ..protocol import BackendError, Conflict, NotFound, Unsupported, WerkError
from ..protocol.states import MAX_PRUNE_IDS, PruneRequest
from ..state.catalog import StateCatalog
from .inventory import CacheItem, CacheKind

__all__ = ["PurgeOutcome", "PurgePlan", "SkipReason", "Skipped", "execute", "plan_all", "plan_one"]


class SkipReason(enum.StrEnum):
    ACTIVE = "active"
    PINNED = "pinned"
    CONVERSATION = "conversation"
    GONE = "gone"


@dataclass(frozen=True, kw_only=True)
class Skipped:
    id: str
    reason: SkipReason
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "reason": self.reason.value, "detail": self.detail}


@dataclass(kw_only=True)
class PurgePlan:
    """What a purge would do: ``remove`` these, ``skip`` those."""

    remove: list[CacheItem] = field(default_factory=list)
    skip: list[Skipped] = field(default_factory=list)


@dataclass(kw_only=True)
class PurgeOutcome:
    """What an executed purge did."""

    removed: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)


def _blocker(item: CacheItem) -> Skipped | None:
    if item.active is not None:
        return Skipped(id=item.id, reason=SkipReason.ACTIVE, detail=f"in use by {item.active}")
    if item.pinned:
        return Skipped(id=item.id, reason=SkipReason.PINNED, detail="pinned")
    return None


def plan_one(items: Sequence[CacheItem], cache_id: str) -> PurgePlan:
    """The plan for one named entry.

    :raises werk.NotFound: no entry has that id.
    """
    for item in items:
        if item.id == cache_id:
            blocker = _blocker(item)
            return PurgePlan(skip=[blocker]) if blocker else PurgePlan(remove=[item])
    raise NotFound(f"no cache entry {cache_id!r}; see `werk cache list`")


def plan_all(items: Sequence[CacheItem], *, include_conversations: bool) -> PurgePlan:
    """The plan for a bulk purge of ``items`` (already filtered)."""
    plan = PurgePlan()
    for item in items:
        blocker = _blocker(item)
        if blocker is None and item.conversation and not include_conversations:
            blocker = Skipped(
                id=item.id,
                reason=SkipReason.CONVERSATION,
                detail="conversation archive kept; add --include-conversations",
            )
        if blocker is not None:
            plan.skip.append(blocker)
        else:
            plan.remove.append(item)
    # Removing a whole session removes its native data too: do not list that twice.
    whole = {
        i.target[0]
        for i in plan.remove
        if i.kind is CacheKind.CHAT and i.target[1:] == ("session",)
    }
    plan.remove = [
        i
        for i in plan.remove
        if not (i.kind is CacheKind.CHAT and i.target[1:] != ("session",) and i.target[0] in whole)
    ]
    return plan


def execute(plan: PurgePlan, home: Path, pm: WerkPluginManager) -> PurgeOutcome:
    """Remove the planned entries, each through its owner."""
    outcome = PurgeOutcome(skipped=list(plan.skip))
    states: dict[str, list[CacheItem]] = defaultdict(list)
    for item in plan.remove:
        if item.kind is CacheKind.STATE:
            states[item.target[0]].append(item)
            continue
        try:
            if item.kind is CacheKind.CHAT:
                done = _remove_chat(home, item)
            elif item.kind is CacheKind.JOB:
                done = _remove_job(home, item)
            else:
                done = _remove_worker(home, pm, item)
        except Conflict as exc:
            outcome.skipped.append(
                Skipped(id=item.id, reason=SkipReason.ACTIVE, detail=exc.message)
            )
            continue
        except WerkError as exc:
            outcome.failed.append((item.id, exc.message))
            continue
        if done:
            outcome.removed.append(item.id)
        else:
            outcome.skipped.append(
                Skipped(id=item.id, reason=SkipReason.GONE, detail="already gone")
            )
    catalog = StateCatalog(home)
    for principal, chosen in states.items():
        for start in range(0, len(chosen), MAX_PRUNE_IDS):
            _prune(catalog, principal, chosen[start : start + MAX_PRUNE_IDS], outcome)
    return outcome


def _remove_chat(home: Path, item: CacheItem) -> bool:
    from ..chat.archive import SessionStore

    name, part = item.target
    return SessionStore(home).remove(name, only_native=part != "session")


def _remove_job(home: Path, item: CacheItem) -> bool:
    import time

    from ..state.jobs import JobStore

    outcome = JobStore(home, clock=time.time).remove(item.target[0])
    if outcome == "unfinished":
        raise Conflict(f"job {item.target[0]} is not finished: its server still runs it")
    return outcome == "removed"


def _remove_worker(home: Path, pm: WerkPluginManager, item: CacheItem) -> bool:
    plugin, entry_id = item.target
    owners = [obj for name, obj in pm.implementers("werk_cache_purge") if name == plugin]
    if not owners:
        raise Unsupported(f"plugin {plugin} cannot purge its caches (no werk_cache_purge)")
    try:
        result: Any = pm.call_plugin(owners[0], "werk_cache_purge", home=home, entry_id=entry_id)
    except WerkError:
        raise
    except Exception as exc:
        raise BackendError(
            f"plugin {plugin} failed to purge {entry_id!r} ({type(exc).__name__})"
        ) from None
    if result is not None:
        return bool(result)
    raise Unsupported(f"plugin {plugin} declined to purge {entry_id!r}")


def _prune(
    catalog: StateCatalog, principal: str, items: list[CacheItem], outcome: PurgeOutcome
) -> None:
    by_state = {item.target[1]: item for item in items}
    try:
        result = catalog.prune(principal, PruneRequest(ids=list(by_state), dry_run=False))
    except WerkError as exc:
        outcome.failed += [(item.id, exc.message) for item in items]
        return
    deleted = set(result.deleted)
    skipped = {skip.id: skip.reason.value for skip in result.skipped}
    for state_id, item in by_state.items():
        if state_id in deleted:
            outcome.removed.append(item.id)
        elif state_id in skipped:
            reason = SkipReason.PINNED if skipped[state_id] == "pinned" else SkipReason.ACTIVE
            outcome.skipped.append(Skipped(id=item.id, reason=reason, detail=skipped[state_id]))
        else:
            outcome.skipped.append(
                Skipped(id=item.id, reason=SkipReason.GONE, detail="already gone")
            )
