"""The live state each persisted chat turn's disk state was written from, for the next turn.

A persisted turn keeps the conversation with its reply as a disk state by snapshotting a live
state the backend still holds (on llama.cpp: the slot the reply was decoded in;
:meth:`~werk.control.prefill.PrefillFlow.keep_continuation`). The conversation's next turn
continues that disk state. While the same process generation still holds the live state,
restoring the disk copy — reading and verifying the payload, copying it, loading it into the
backend — rebuilds what is already there, at a cost that grows with the state's size.
:class:`LiveKept` remembers, per state kept that way, the live
state it was written from; the prefix lookup (:class:`~werk.control.reuse.ReuseLookup`) offers
it to the backend instead of the disk copy, with ``reuse: required``: the backend continues it
where it still holds it, and refuses with ``reuse_unavailable`` where it does not (its slot went
to another state), and then the disk copy is restored as before.

* Only for backends whose live states live outside ``werk serve`` (not
  ``BackendDescriptor.states_in_process``): remembering one costs Werk a reference, and the
  backend decides how long it keeps the state. An in-process backend's live state is its bytes
  in Werk's memory, which only the ``ram`` tier may hold (accounted).
* A remembered state is offered once (continuing it changes what the backend holds); it is
  found only under the principal and state id it was kept as, only for the process generation
  that made it, and at most :data:`LIMIT` are remembered (the oldest are forgotten first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection

from ..backends import BackendState

__all__ = ["LIMIT", "LiveKept"]

LIMIT = 64
"""The most live states remembered at once (one per recently active conversation)."""


class LiveKept:
    """Live states by the ``(principal, state id)`` of the disk state written from them."""

    def __init__(self, limit: int = LIMIT) -> None:
        if limit < 1:
            raise ValueError("a LiveKept needs room for at least one state")
        self._limit = limit
        self._states: OrderedDict[tuple[str, str], BackendState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def remember(self, principal: str, state_id: str, live: BackendState) -> None:
        """``state_id`` (a disk state of ``principal``) was written from ``live``."""
        self._states[(principal, state_id)] = live
        self._states.move_to_end((principal, state_id))
        while len(self._states) > self._limit:
            self._states.popitem(last=False)

    def take(self, principal: str, state_id: str, generation: str) -> BackendState | None:
        """The live state ``state_id`` was written from, if the running process generation
        ``generation`` made it; forgotten either way (it is offered once)."""
        live = self._states.pop((principal, state_id), None)
        if live is None or live.generation != generation:
            return None
        return live

    def drop_generations(self, live_generations: Collection[str]) -> None:
        """Forget the states of process generations that ended."""
        for key in [k for k, s in self._states.items() if s.generation not in live_generations]:
            del self._states[key]
