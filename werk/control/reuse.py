"""Which stored state a prefill reuses: one of exactly its prompt, else (where the backend
continues prefixes) the one sharing the longest prefix with it, restored into the runtime."""

from __future__ import annotations

import contextlib
import time

import anyio
import msgspec

from ..backends import BackendState, Operation, Runtime, StateKind
from ..protocol import CapabilityId, IncompatibleState, StateSummary
from ..state.envelope import Envelope
from .accounting import RestoreResult
from .context import ServiceContext
from .continuation import prefix_offered, prefix_proven
from .continuation import why_not_across as _why_not_across
from .gates import gate, status_of
from .live_kept import LiveKept
from .payloads import materialize

__all__ = ["Reusable", "ReuseLookup"]


class Reusable(msgspec.Struct, frozen=True):
    state_id: str
    payload: BackendState
    summary: StateSummary
    earlier_generation: bool = False
    """A disk state an earlier process generation made (restored on cross-restart proof)."""
    restored: bool = False
    """Handed to the backend from the disk store in this request (counted as a restore)."""
    prefix: bool = False
    """Its prompt shares only a prefix with this one: the prefill continues it."""
    live: bool = False
    """``payload`` is the live state the disk state was written from, still in this process
    generation (:mod:`werk.control.live_kept`): offered with ``reuse: required``; where the
    backend no longer holds it, :meth:`ReuseLookup.from_disk` restores the disk copy."""


class ReuseLookup:
    """The reuse side of :class:`~werk.control.prefill.PrefillFlow`."""

    def __init__(self, service: ServiceContext, live_kept: LiveKept) -> None:
        self.s = service
        self.live_kept = live_kept

    async def find_prefix(
        self,
        principal: str,
        chain: list[tuple[int, str]],
        envelope: Envelope,
        runtime: Runtime,
        allow_experimental: bool,
    ) -> tuple[Reusable | None, IncompatibleState | None]:
        """The stored state sharing the longest prefix with the prompt, restored, when the
        backend continues prefixes (:mod:`werk.control.continuation`); else why not."""
        if not prefix_offered(await self.s.rows_for(runtime.model, runtime), allow_experimental):
            return None, None
        found = await anyio.to_thread.run_sync(lambda: self.s.catalog.find_prefix(principal, chain))
        refusal: IncompatibleState | None = None
        for _shared, stored in found:
            across = not stored.envelope.compatible_with(envelope)
            if across and not stored.envelope.compatible_with(envelope, across_generations=True):
                continue
            if across and (why_not := await self.why_not_across(runtime, allow_experimental)):
                refusal = IncompatibleState(
                    f"a stored state shares a prefix with this prompt, but it cannot be "
                    f"restored into the running process: {why_not}",
                    capability=CapabilityId.STATE_RESTORE_CROSS_RESTART,
                )
                continue
            if not across:
                rows = await self.s.rows_for(runtime.model, runtime)
                gate(rows, CapabilityId.STATE_RESTORE, allow_experimental=allow_experimental)
                live_state = self.live_kept.take(principal, stored.id, runtime.generation)
                if live_state is not None and prefix_proven(rows, allow_experimental):
                    summary = stored.summary(reusable=True)
                    return Reusable(stored.id, live_state, summary, prefix=True, live=True), None
            try:
                live = await self.restore(principal, stored.id, runtime)
            except IncompatibleState as exc:
                refusal = exc
                continue
            rows = await self.s.rows_for(runtime.model, runtime)  # the probe may have run
            if not prefix_proven(rows, allow_experimental):
                row = status_of(rows, CapabilityId.STATE_RESTORE_PREFIX)
                why = row.reason if row is not None and row.reason else "not reported"
                return None, IncompatibleState(
                    f"the backend has not proven prefix continuation: {why}",
                    capability=CapabilityId.STATE_RESTORE_PREFIX,
                )
            summary = stored.summary(reusable=True)
            return Reusable(
                stored.id, live, summary, earlier_generation=across, restored=True, prefix=True
            ), None
        return None, refusal

    async def find_exact(
        self,
        principal: str,
        fingerprint: str,
        envelope: Envelope,
        runtime: Runtime,
        allow_experimental: bool,
    ) -> tuple[list[Envelope], Reusable | None, IncompatibleState | None]:
        """Envelopes of every candidate state, a loaded compatible one if any, and the
        backend's refusal of an earlier generation's state (when it refused one)."""
        volatile = self.s.volatile.find(principal, fingerprint)
        stored = await anyio.to_thread.run_sync(
            lambda: self.s.catalog.find(principal, fingerprint=fingerprint)
        )
        envelopes = [v.envelope for v in volatile] + [s.envelope for s in stored]
        for entry in volatile:
            if entry.envelope.compatible_with(envelope):
                self.s.volatile.touch(entry)
                reused = Reusable(entry.id, entry.state, entry.summary(reusable=True))
                return envelopes, reused, None
        for stored_state in stored:
            if not stored_state.envelope.compatible_with(envelope):
                continue
            rows = await self.s.rows_for(runtime.model, runtime)
            gate(rows, CapabilityId.STATE_RESTORE, allow_experimental=allow_experimental)
            live = await self.restore(principal, stored_state.id, runtime)
            summary = stored_state.summary(reusable=True)
            return envelopes, Reusable(stored_state.id, live, summary, restored=True), None
        refusal: IncompatibleState | None = None
        for stored_state in stored:
            if not stored_state.envelope.compatible_with(envelope, across_generations=True):
                continue
            why_not = await self.why_not_across(runtime, allow_experimental)
            if why_not is not None:
                refusal = IncompatibleState(
                    "a stored state of an earlier process generation exists for this prompt, "
                    f"but it cannot be restored into the running one: {why_not}",
                    capability=CapabilityId.STATE_RESTORE_CROSS_RESTART,
                )
                break
            try:
                live = await self.restore(principal, stored_state.id, runtime)
            except IncompatibleState as exc:  # the backend's proof failed (or was refused)
                refusal = exc
                continue
            summary = stored_state.summary(reusable=True)
            reused = Reusable(
                stored_state.id, live, summary, earlier_generation=True, restored=True
            )
            return envelopes, reused, None
        return envelopes, None, refusal

    async def from_disk(self, principal: str, reused: Reusable, runtime: Runtime) -> Reusable:
        """``reused`` — a live state the backend no longer holds — restored from its disk
        copy instead."""
        payload = await self.restore(principal, reused.state_id, runtime)
        return msgspec.structs.replace(reused, payload=payload, live=False, restored=True)

    async def why_not_across(self, runtime: Runtime, allow_experimental: bool) -> str | None:
        """:func:`werk.control.continuation.why_not_across` for this runtime's rows."""
        return _why_not_across(await self.s.rows_for(runtime.model, runtime), allow_experimental)

    async def restore(self, principal: str, state_id: str, runtime: Runtime) -> BackendState:
        """Hand a hash-verified payload to the backend and mark it loaded only on success.
        Counted as an attempted restore; a refusal (``incompatible_state``) as refused."""
        self.s.accounting.restore_attempted(principal, runtime.model.id)
        started = time.monotonic()
        try:
            restored = await self._restore_payload(principal, state_id, runtime)
            self.s.restore_latency.observe(time.monotonic() - started)
            return restored
        except IncompatibleState:
            self.s.accounting.restore_ended(principal, runtime.model.id, RestoreResult.REFUSED)
            raise

    async def _restore_payload(
        self, principal: str, state_id: str, runtime: Runtime
    ) -> BackendState:
        path = await anyio.to_thread.run_sync(lambda: materialize(self.s, principal, state_id))
        try:
            payload = BackendState(kind=StateKind.FILE, path=path, generation=runtime.generation)
            restored: BackendState = await self.s.pm.call_operation(
                Operation.RESTORE, runtime, payload=payload
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        await anyio.to_thread.run_sync(lambda: self.s.catalog.mark_loaded(principal, state_id))
        return restored
