"""The caller's view of named states: disk catalog entries plus volatile backend states.

Reads are strictly read-only. ``reusable`` is decided here, not by the catalog: a state is
reusable only when a live runtime's complete envelope (for this principal) equals the state's.
"""

from __future__ import annotations

import anyio
import msgspec

from ..protocol import (
    CapabilityId,
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
from ..state.catalog import StoredState
from ..state.envelope import Envelope
from .context import ServiceContext
from .interface import StateQuery
from .volatile import VolatileState

__all__ = ["StateViews"]

_TIER_CAPABILITY = {
    Tier.DISK: CapabilityId.STATE_TIER_DISK,
    Tier.RAM: CapabilityId.STATE_TIER_RAM,
    Tier.VRAM: CapabilityId.STATE_TIER_VRAM,
    Tier.BACKEND: CapabilityId.STATE_PREFIX_CACHE,
}


class StateViews:
    def __init__(self, service: ServiceContext) -> None:
        self.s = service

    def _reusable(self, envelope: Envelope, model: str, principal: str) -> bool:
        live = self.s.live_envelope(model, principal)
        return live is not None and live.compatible_with(envelope)

    def _summary(self, entry: StoredState | VolatileState, principal: str) -> StateSummary:
        return entry.summary(reusable=self._reusable(entry.envelope, entry.model, principal))

    async def listing(self, principal: str, query: StateQuery) -> StateList:
        self.s.forget_dead_generations()
        entries: list[StoredState | VolatileState] = []
        if query.tier in (None, Tier.BACKEND):
            entries += self.s.volatile.entries(principal, model=query.model, pinned=query.pinned)
        if query.tier is not Tier.BACKEND:
            stored = await anyio.to_thread.run_sync(
                lambda: self.s.catalog.list(
                    principal, model=query.model, tier=query.tier, pinned=query.pinned
                )
            )
            entries += stored
        entries.sort(key=lambda e: (e.created_at, e.id))
        return StateList(states=[self._summary(e, principal) for e in entries])

    async def _get(self, principal: str, state_id: str) -> StoredState | VolatileState:
        self.s.forget_dead_generations()
        try:
            return self.s.volatile.get(principal, state_id)
        except NotFound:
            pass
        return await anyio.to_thread.run_sync(lambda: self.s.catalog.get(principal, state_id))

    async def inspect(self, principal: str, state_id: str) -> StateSummary:
        return self._summary(await self._get(principal, state_id), principal)

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
            if f.tier is not None and f.tier is not Tier.BACKEND:
                return []
            if f.expired:  # expired volatile states are already gone from the index
                return []
            now = self.s.clock()
            return [
                e
                for e in entries
                if (f.model is None or e.model == f.model)
                and (f.older_than_seconds is None or now - e.created_at >= f.older_than_seconds)
            ]
        return entries  # all

    async def pin(self, principal: str, state_id: str, request: PinRequest) -> PinResult:
        entry = await self._get(principal, state_id)
        if request.dry_run:
            preview = self._summary(entry, principal)
            return PinResult(dry_run=True, state=_with_pin(preview, request.pinned))
        if isinstance(entry, VolatileState):
            updated: StoredState | VolatileState = self.s.volatile.set_pinned(
                principal, state_id, request.pinned
            )
        else:
            updated = await anyio.to_thread.run_sync(
                lambda: self.s.catalog.set_pinned(principal, state_id, request.pinned)
            )
        return PinResult(dry_run=False, state=self._summary(updated, principal))

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
