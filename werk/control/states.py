"""The caller's view of named states: disk catalog entries plus volatile backend states.

Reads are strictly read-only. ``reusable`` is decided here, not by the catalog: a state is
reusable only when a live runtime's complete envelope (for this principal) equals the state's —
or, for a disk state of an earlier process generation, equals it in every other dimension and
that runtime proved cross-restart restore (``runtime.state.restore.cross_restart``
``experimental``). Otherwise ``reusable_reason`` says why not.
"""

from __future__ import annotations

import anyio
import msgspec

from ..protocol import (
    CapabilityId,
    CapabilityStatus,
    NotFound,
    PinRequest,
    PinResult,
    PruneRequest,
    PruneResult,
    PruneSkip,
    SkipReason,
    StateList,
    StateSummary,
    Tier,
    TierRequest,
    TierResult,
    Unsupported,
)
from ..protocol.paging import MAX_PAGE, encode_cursor, page_after
from ..state.catalog import StoredState
from ..state.envelope import Envelope
from .context import ServiceContext
from .gates import status_of
from .interface import StateQuery
from .volatile import VolatileState

__all__ = ["StateViews", "reusability"]

_Live = tuple[Envelope, bool, str] | None
_PROVEN = (CapabilityStatus.EXPERIMENTAL, CapabilityStatus.SUPPORTED)
_DIMENSIONS = {
    "adapter": "adapter",
    "adapter_version": "adapter version",
    "backend": "backend",
    "executable": "backend executable",
    "model_identity": "model identity",
    "runtime_args": "runtime arguments",
    "cache_layout": "cache layout",
    "principal": "principal",
}


def reusability(entry: StoredState | VolatileState, live: _Live) -> tuple[bool, str | None]:
    """Whether ``entry`` is reusable by the live runtime of its model now, and if not, why."""
    if live is None:
        return False, (
            f"no runtime of model {entry.model!r} is loaded; the first request for it starts one"
        )
    envelope, proven, why_not = live
    if entry.envelope.compatible_with(envelope):
        return True, None
    differing = [d for d in entry.envelope.differences(envelope) if d != "generation"]
    if differing:
        names = ", ".join(_DIMENSIONS.get(d, d) for d in differing)
        return False, f"incompatible: made by a runtime that differs in {names}"
    if isinstance(entry, VolatileState):
        return False, "an in-memory state ends with the process generation that made it"
    if proven:
        return True, None
    return False, (
        "made by an earlier process generation; cross-restart restore is not proven for the "
        f"running one: {why_not}"
    )


_TIER_CAPABILITY = {
    Tier.DISK: CapabilityId.STATE_TIER_DISK,
    Tier.RAM: CapabilityId.STATE_TIER_RAM,
    Tier.VRAM: CapabilityId.STATE_TIER_VRAM,
    Tier.BACKEND: CapabilityId.STATE_PREFIX_CACHE,
}


_VOLATILE_TIERS = (Tier.BACKEND, Tier.RAM)
"""Tiers of the volatile index (``ram``: states of in-process backends); the catalog holds
``disk``."""


class StateViews:
    def __init__(self, service: ServiceContext) -> None:
        self.s = service

    async def _live(
        self, entries: list[StoredState | VolatileState], principal: str
    ) -> dict[str, _Live]:
        """Per model of ``entries``: the live runtime's envelope and whether it proved
        cross-restart restore (``None`` when no runtime of the model is loaded). The backend's
        rows are asked only for a model with a disk state of an earlier generation that the
        proof would decide; the common listing asks nothing."""
        live = self.s.runtimes.live()
        envelopes = {
            model: (self.s.envelope_for(runtime, principal), runtime)
            for model in {e.model for e in entries}
            if (runtime := live.get(model)) is not None
        }
        undecided = {
            e.model
            for e in entries
            if isinstance(e, StoredState)
            and e.model in envelopes
            and not e.envelope.compatible_with(envelopes[e.model][0])
            and e.envelope.compatible_with(envelopes[e.model][0], across_generations=True)
        }
        out: dict[str, _Live] = dict.fromkeys({e.model for e in entries})
        for model, (envelope, runtime) in envelopes.items():
            proven, why = False, "not needed"
            if model in undecided:
                row = status_of(
                    await self.s.rows_for(runtime.model, runtime),
                    CapabilityId.STATE_RESTORE_CROSS_RESTART,
                )
                proven = row is not None and row.status in _PROVEN
                why = (row.reason if row is not None else None) or "not reported by the backend"
            out[model] = (envelope, proven, why)
        return out

    async def _summaries(
        self, entries: list[StoredState | VolatileState], principal: str
    ) -> list[StateSummary]:
        live = await self._live(entries, principal)
        out = []
        for entry in entries:
            reusable, reason = reusability(entry, live[entry.model])
            out.append(entry.summary(reusable=reusable, reason=reason))
        return out

    async def _summary(self, entry: StoredState | VolatileState, principal: str) -> StateSummary:
        return (await self._summaries([entry], principal))[0]

    async def listing(self, principal: str, query: StateQuery) -> StateList:
        """The states by id (creation order); a page of them when ``query.limit`` is set (the
        store reads the metadata of that page only)."""
        self.s.forget_dead_generations()
        entries: list[StoredState | VolatileState] = []
        if query.tier in (None, *_VOLATILE_TIERS):
            volatile = self.s.volatile.entries(principal, model=query.model, pinned=query.pinned)
            entries += [
                v
                for v in volatile
                if (query.after is None or v.id > query.after) and query.tier in (None, v.tier)
            ]
        more_stored = False
        if query.tier not in _VOLATILE_TIERS:
            if query.limit is None and query.after is None:
                stored = await anyio.to_thread.run_sync(
                    lambda: self.s.catalog.list(
                        principal, model=query.model, tier=query.tier, pinned=query.pinned
                    )
                )
            else:
                limit = query.limit if query.limit is not None else MAX_PAGE
                stored, more_stored = await anyio.to_thread.run_sync(
                    lambda: self.s.catalog.page(
                        principal,
                        after=query.after,
                        limit=limit,
                        model=query.model,
                        tier=query.tier,
                        pinned=query.pinned,
                    )
                )
            entries += stored
        entries.sort(key=lambda e: e.id)
        page, cursor = page_after(entries, lambda e: e.id, query.limit, None)
        if cursor is None and more_stored and page:
            cursor = encode_cursor(page[-1].id)  # the store holds more after this page
        return StateList(states=await self._summaries(page, principal), next_cursor=cursor)

    async def _get(self, principal: str, state_id: str) -> StoredState | VolatileState:
        self.s.forget_dead_generations()
        try:
            return self.s.volatile.get(principal, state_id)
        except NotFound:
            pass
        return await anyio.to_thread.run_sync(lambda: self.s.catalog.get(principal, state_id))

    async def inspect(self, principal: str, state_id: str) -> StateSummary:
        return await self._summary(await self._get(principal, state_id), principal)

    async def prune(self, principal: str, request: PruneRequest) -> PruneResult:
        self.s.forget_dead_generations()
        busy = SkipReasonLookup(self.s, principal)
        volatile = self._volatile_selection(principal, request)
        result = await anyio.to_thread.run_sync(
            lambda: self.s.catalog.prune(principal, request, busy=busy)
        )
        selected, deleted, skipped = (
            list(result.selected),
            list(result.deleted),
            list(result.skipped),
        )
        for entry in volatile:
            selected.append(entry.id)
            reason = busy(entry.id)
            if reason is None and entry.pinned:
                reason = SkipReason.PINNED
            if reason is not None:
                skipped.append(PruneSkip(id=entry.id, reason=reason))
            elif not request.dry_run:
                self.s.volatile.remove(principal, entry.id)
                deleted.append(entry.id)
        return PruneResult(
            dry_run=request.dry_run, selected=selected, deleted=deleted, skipped=skipped
        )

    def _volatile_selection(self, principal: str, request: PruneRequest) -> list[VolatileState]:
        entries = self.s.volatile.entries(principal)
        if request.ids is not None:
            wanted = set(request.ids)
            return [e for e in entries if e.id in wanted]
        if request.filter is not None:
            f = request.filter
            if f.tier is not None and f.tier not in _VOLATILE_TIERS:
                return []
            if f.expired:  # expired volatile states are already gone from the index
                return []
            now = self.s.clock()
            return [
                e
                for e in entries
                if (f.model is None or e.model == f.model)
                and (f.tier is None or e.tier is f.tier)
                and (f.older_than_seconds is None or now - e.created_at >= f.older_than_seconds)
            ]
        return entries  # all

    async def pin(self, principal: str, state_id: str, request: PinRequest) -> PinResult:
        entry = await self._get(principal, state_id)
        if request.dry_run:
            preview = await self._summary(entry, principal)
            return PinResult(dry_run=True, state=_with_pin(preview, request.pinned))
        if isinstance(entry, VolatileState):
            updated: StoredState | VolatileState = self.s.volatile.set_pinned(
                principal, state_id, request.pinned
            )
        else:
            updated = await anyio.to_thread.run_sync(
                lambda: self.s.catalog.set_pinned(principal, state_id, request.pinned)
            )
        return PinResult(dry_run=False, state=await self._summary(updated, principal))

    async def tier(self, principal: str, state_id: str, request: TierRequest) -> TierResult:
        entry = await self._get(principal, state_id)
        # No loaded adapter offers a side-effect-free snapshot inspection or a tier move, so
        # even the preview is refused rather than obtaining a real snapshot to predict one.
        raise Unsupported(
            f"moving a {entry.tier} state to {request.target} is not offered by backend "
            f"{entry.backend!r}",
            capability=_TIER_CAPABILITY[request.target],
        )


class SkipReasonLookup:
    """``busy(state_id)`` for prune: a live or in-use handoff keeps a state."""

    def __init__(self, service: ServiceContext, principal: str) -> None:
        self._live = service.handoffs.live_state_ids(principal)

    def __call__(self, state_id: str) -> SkipReason | None:
        return SkipReason.LIVE_HANDOFF if state_id in self._live else None


def _with_pin(summary: StateSummary, pinned: bool) -> StateSummary:
    return msgspec.structs.replace(summary, pinned=pinned)
