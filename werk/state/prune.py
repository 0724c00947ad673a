"""Which states a prune request selects, and which of those it must skip (pure functions).

* ``ids``: the listed ids that exist for the principal, in request order, without duplicates.
  An unknown id (or another principal's) is simply not selected — nothing reveals which.
* ``filter``: every constraint must hold (model, tier, age ``>= older_than_seconds``,
  ``expired``). The protocol type already refuses an empty filter.
* ``all`` (with its separate confirmation): every state of the principal.

Expired states are selected like any other and always deleted: TTL is stronger than pin and
than a live handoff. A live selected state is skipped when pinned (``pinned``) or when the
server's ``busy`` callback names a reason (``live_handoff``, ``active``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..protocol.states import PruneFilter, PruneRequest, PruneSkip, SkipReason
from .metadata import StoredState

__all__ = ["BusyCheck", "Selection", "never_busy", "select"]

BusyCheck = Callable[[str], SkipReason | None]
"""Given a state id, the reason it must not be deleted now, or ``None``."""


def never_busy(state_id: str) -> SkipReason | None:
    """The default :data:`BusyCheck`: nothing is busy."""
    return None


class Selection:
    """The outcome of :func:`select`: ``selected`` = ``delete`` + the ids in ``skipped``."""

    __slots__ = ("delete", "selected", "skipped")

    def __init__(self, selected: list[str], delete: list[str], skipped: list[PruneSkip]) -> None:
        self.selected = selected
        self.delete = delete
        self.skipped = skipped


def _matches(state: StoredState, flt: PruneFilter, now: float) -> bool:
    if flt.model is not None and state.model != flt.model:
        return False
    if flt.tier is not None and state.tier != flt.tier:
        return False
    if flt.older_than_seconds is not None and now - state.created_at < flt.older_than_seconds:
        return False
    return not (flt.expired is True and not state.expired(now))


def select(
    states: Sequence[StoredState], request: PruneRequest, now: float, busy: BusyCheck
) -> Selection:
    """Apply ``request`` to one principal's ``states`` (expired ones included)."""
    if request.ids is not None:
        by_id = {s.id: s for s in states}
        candidates = [by_id[i] for i in dict.fromkeys(request.ids) if i in by_id]
    elif request.filter is not None:
        flt = request.filter
        candidates = [s for s in states if _matches(s, flt, now)]
    else:
        candidates = list(states)
    delete: list[str] = []
    skipped: list[PruneSkip] = []
    for state in candidates:
        reason: SkipReason | None = None
        if not state.expired(now):
            reason = SkipReason.PINNED if state.pinned else busy(state.id)
        if reason is None:
            delete.append(state.id)
        else:
            skipped.append(PruneSkip(id=state.id, reason=reason))
    return Selection([s.id for s in candidates], delete, skipped)
