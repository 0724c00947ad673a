"""Prefill and decode: policy, reuse, gating, persistence and single-use handoffs.

Prefill order (seed "Prefill/decode handoff"): resolve the effective policy; start or find the
runtime; gate ``runtime.pd.prefill``; look up reusable states; **reserve a handoff slot before
any backend or persistence work** (rolled back on failure); run the backend; keep the named
state per the retention tier; issue the token.

Decode order: **consume the handoff before calling the backend** (single use even if decode
fails); run the backend; bound the completion text to 1 MiB of UTF-8; reuse the held slot for a
replacement token or release it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, NamedTuple

import anyio
import msgspec

from ..backends import (
    BackendState,
    DecodeCall,
    DecodeOutcome,
    ModelSpec,
    Operation,
    PrefillCall,
    PrefillOutcome,
    Runtime,
)
from ..protocol import (
    CapabilityId,
    DecodeRequest,
    DecodeResponse,
    DecodeUsage,
    IncompatibleState,
    Policy,
    PrefillRequest,
    PrefillResponse,
    PrefillUsage,
    Reuse,
    ReuseInfo,
    ReuseMatch,
    ReuseOutcome,
    ReuseUnavailable,
    StateSummary,
    Tier,
    Unavailable,
)
from ..state.envelope import Envelope
from ..state.handoffs import HandoffBinding, bound_completion_text
from ..state.policy import (
    classify_candidates,
    decide_reuse,
    effective_prefill_policy,
    resolve_retention,
)
from ..state.prefixes import prefix_chain
from ..state.principals import prompt_fingerprint
from .accounting import RestoreResult
from .context import ServiceContext
from .continuation import prefix_proven
from .gates import gate
from .live_kept import LiveKept
from .payloads import DiskCopy, owned_payload
from .reuse import Reusable, ReuseLookup
from .streamed_text import StreamedText

__all__ = ["DecodedTurn", "PrefillFlow"]

log = logging.getLogger("werk.control")


def _message_pairs(request: PrefillRequest) -> list[tuple[str, str]] | None:
    if request.messages is None:
        return None
    return [(m.role, m.content) for m in request.messages]


def _proper(chain: list[tuple[int, str]], request: PrefillRequest) -> list[tuple[int, str]]:
    """The elements of a prompt's chain before its end (the whole prompt is the exact lookup)."""
    end = len(request.prompt) if request.prompt is not None else len(request.messages or ())
    return [element for element in chain if element[0] < end]


def _reuse_info(outcome: ReuseOutcome, reused: Reusable | None, done: PrefillOutcome) -> ReuseInfo:
    if reused is None:
        return ReuseInfo(outcome=outcome)
    return ReuseInfo(
        outcome=outcome,
        state_id=reused.state_id,
        match=ReuseMatch.PREFIX if reused.prefix else ReuseMatch.EXACT,
        restored_tokens=done.restored_tokens,
    )


class _Live(msgspec.Struct, frozen=True):
    """What a handoff carries to decode (opaque to the registry)."""

    model: str
    state: BackendState
    persisted: bool = False
    """The handoff's ``state_id`` names a disk state: decode may restore the state from it."""


class DecodedTurn(NamedTuple):
    """A decode's answer and what it continued."""

    response: DecodeResponse
    state: BackendState
    """The live state the decode ended in (``DecodeOutcome.after``), else the one the handoff
    carried (the backend may hold the reply on top of it)."""
    runtime: Runtime


class PrefillFlow:
    def __init__(self, service: ServiceContext) -> None:
        self.s = service
        self.live_kept = LiveKept()
        """The live states persisted turns were kept from (:mod:`werk.control.live_kept`)."""
        self.reuse = ReuseLookup(service, self.live_kept)

    # -- prefill -----------------------------------------------------------------------------

    def _fingerprint(self, principal: str, spec: ModelSpec, request: PrefillRequest) -> str:
        # The envelope is deliberately not part of the fingerprint: a state produced by another
        # runtime must be *found* so it can be reported as incompatible, not as a miss.
        return prompt_fingerprint(
            self.s.config.namespace_key,
            principal,
            model=spec.id,
            envelope_digest="",
            prompt=request.prompt,
            messages=_message_pairs(request),
        )

    def _chain(
        self, principal: str, spec: ModelSpec, request: PrefillRequest
    ) -> list[tuple[int, str]]:
        """The prompt's prefix fingerprints, its whole prompt included where that ends on a
        boundary (:mod:`werk.state.prefixes`): what a kept state records; the lookup uses the
        proper prefixes of the same chain (:func:`_proper`)."""
        return prefix_chain(
            self.s.config.namespace_key,
            principal,
            model=spec.id,
            prompt=request.prompt,
            messages=_message_pairs(request),
            whole=True,
        )

    def prompt_prefixes(self, principal: str, request: PrefillRequest) -> frozenset[str]:
        """The fingerprints of ``request``'s prompt and of its prefixes: a stored state whose
        last recorded fingerprint is among them holds a prefix of this prompt, whole."""
        spec = self.s.spec(request.model)
        return frozenset(fp for _, fp in self._chain(principal, spec, request))

    async def prefill(
        self, principal: str, request: PrefillRequest, *, origin: Literal["chat"] | None = None
    ) -> PrefillResponse:
        """One prefill; ``origin`` is recorded with a kept disk state (``chat``: a persisted
        ``/v1`` chat turn, :mod:`werk.control.chat_states`)."""
        spec = self.s.spec(request.model)
        with await self.s.runtimes.use(spec) as use:  # busy: no idle unload meanwhile
            return await self._prefill(principal, request, spec, use.runtime, origin)

    async def _prefill(
        self,
        principal: str,
        request: PrefillRequest,
        spec: ModelSpec,
        runtime: Runtime,
        origin: Literal["chat"] | None = None,
    ) -> PrefillResponse:
        effective = effective_prefill_policy(request, self.s.config.persistence_defaults)
        policy, allow = effective.policy, effective.allow_experimental
        self.s.forget_dead_generations()
        gate(
            await self.s.rows_for(spec, runtime),
            CapabilityId.PD_PREFILL,
            allow_experimental=allow,
            probe_on_use=True,
        )
        envelope = self.s.envelope_for(runtime, principal)
        fingerprint = self._fingerprint(principal, spec, request)
        # one pass over the prompt, for the prefix lookup and for a kept state, when needed
        chain_of = functools.cache(lambda: self._chain(principal, spec, request))

        reused: Reusable | None = None
        if policy.reuse.value != "disabled":
            envelopes, reused, refusal = await self.reuse.find_exact(
                principal, fingerprint, envelope, runtime, allow
            )
            if reused is None and refusal is None:  # no state of this very prompt: a prefix?
                chain = _proper(chain_of(), request)
                if chain:
                    reused, refusal = await self.reuse.find_prefix(
                        principal, chain, envelope, runtime, allow
                    )
            if reused is not None:
                outcome_kind = ReuseOutcome.REUSED
            elif refusal is not None and policy.reuse is Reuse.REQUIRED:
                raise refusal  # the backend's own reason, never a silent fresh prefill
            else:
                outcome_kind = decide_reuse(policy.reuse, classify_candidates(envelope, envelopes))
        else:
            outcome_kind = ReuseOutcome.DISABLED

        with self.s.handoffs.reserve(principal) as reservation:
            outcome, reused = await self._continue(
                principal,
                runtime,
                request,
                policy,
                reused,
                keep=policy.retention.value != "ephemeral",
            )
            # The probe (if any) ran inside the backend call: gate on the statuses as they are now.
            rows = await self.s.rows_for(spec, runtime)
            gate(rows, CapabilityId.PD_PREFILL, allow_experimental=allow)
            gate(rows, CapabilityId.PD_HANDOFF, allow_experimental=allow)
            statuses = {row.id: row.status for row in rows}
            self.s.accounting.prefill(
                principal, spec.id, outcome.prompt_tokens, outcome.cached_tokens
            )
            if reused is not None and reused.restored and outcome.cached_tokens is not None:
                self.s.accounting.restore_ended(
                    principal,
                    spec.id,
                    RestoreResult.VERIFIED if outcome.cached_tokens > 0 else RestoreResult.REFUSED,
                )
            if reused is not None and outcome.cached_tokens == 0:
                # The backend evaluated the prompt afresh (its state was no longer resident):
                # never report reuse it did not observe; `required` never falls through.
                if policy.reuse is Reuse.REQUIRED and reused.earlier_generation:
                    raise IncompatibleState(
                        "the state of an earlier process generation was restored, but the "
                        "backend reported no reused tokens: cross-restart reuse is not proven"
                    )
                if policy.reuse is Reuse.REQUIRED:
                    raise ReuseUnavailable("the stored state was not resident; nothing was reused")
                reused, outcome_kind = None, ReuseOutcome.FRESH
            summary: StateSummary | None
            state_id: str | None
            if reused is not None and not reused.prefix:
                summary, state_id = reused.summary, reused.state_id
            else:  # a new prompt (a continued one included): keep its own state
                tier = resolve_retention(policy, statuses, allow_experimental=allow)
                summary = await self._keep(
                    principal,
                    spec,
                    runtime,
                    envelope,
                    fingerprint,
                    outcome.state,
                    tier,
                    policy.ttl_seconds,
                    policy.pin,
                    prefixes=chain_of,
                    origin=origin,
                )
                state_id = summary.id if summary is not None else None
            persisted = summary is not None and summary.tier is Tier.DISK
            issued = reservation.issue(
                HandoffBinding(
                    envelope=envelope,
                    payload=_Live(model=spec.id, state=outcome.state, persisted=persisted),
                    state_id=state_id,
                )
            )
        return PrefillResponse(
            state=summary,
            handoff=issued.to_protocol(),
            reuse=_reuse_info(outcome_kind, reused, outcome),
            usage=PrefillUsage(
                prompt_tokens=outcome.prompt_tokens,
                cached_tokens=outcome.cached_tokens,
                evaluated_tokens=(
                    outcome.prompt_tokens - outcome.cached_tokens
                    if outcome.cached_tokens is not None
                    else None
                ),
            ),
        )

    async def _continue(
        self,
        principal: str,
        runtime: Runtime,
        request: PrefillRequest,
        policy: Policy,
        reused: Reusable | None,
        *,
        keep: bool,
    ) -> tuple[PrefillOutcome, Reusable | None]:
        """The backend's prefill of ``request``, continuing ``reused`` if any. A live state
        (:attr:`Reusable.live`) is offered with ``reuse: required``; where the backend no
        longer holds it, its disk copy is restored and offered instead."""
        if reused is not None and reused.live:
            try:
                outcome = await self._backend_prefill(
                    runtime,
                    request,
                    msgspec.structs.replace(policy, reuse=Reuse.REQUIRED),
                    keep=keep,
                    reuse_from=reused.payload,
                    continued=True,
                )
                return outcome, reused
            except ReuseUnavailable:
                log.debug(
                    "state %s: its live state is gone; restoring its disk copy", reused.state_id
                )
                reused = await self.reuse.from_disk(principal, reused, runtime)
        outcome = await self._backend_prefill(
            runtime,
            request,
            policy,
            keep=keep,
            reuse_from=reused.payload if reused is not None else None,
            continued=reused is not None and reused.prefix,
        )
        return outcome, reused

    async def _backend_prefill(
        self,
        runtime: Runtime,
        request: PrefillRequest,
        policy: Policy,
        *,
        keep: bool,
        reuse_from: BackendState | None,
        continued: bool,
        decode: bool = True,
    ) -> PrefillOutcome:
        """``werk_prefill`` on the owning plugin for ``request``'s prompt or messages."""
        call = PrefillCall(
            prompt=request.prompt,
            messages=request.messages,
            policy=policy,
            keep=keep,
            reuse_from=reuse_from,
            continued=continued,
            decode=decode,
        )
        outcome: PrefillOutcome = await self.s.pm.call_operation(
            Operation.PREFILL, runtime, call=call
        )
        return outcome

    async def _keep(
        self,
        principal: str,
        spec: ModelSpec,
        runtime: Runtime,
        envelope: Envelope,
        fingerprint: str,
        state: BackendState,
        tier: Tier | None,
        ttl_seconds: int | None,
        pin: bool,
        *,
        prefixes: Callable[[], list[tuple[int, str]]],
        origin: Literal["chat"] | None = None,
    ) -> StateSummary | None:
        """Keep the evaluated prefix as a named state in ``tier`` (``None``: ephemeral);
        a disk state records its prompt's prefix fingerprints (``prefixes()``)."""
        if tier is None:
            return None
        if tier in (Tier.BACKEND, Tier.RAM):
            # A ram state reserves its bytes (in a worker thread: relief comes back here).
            entry = await anyio.to_thread.run_sync(
                lambda: self.s.volatile.add(
                    principal=principal,
                    envelope=envelope,
                    model=spec.id,
                    backend=spec.backend,
                    fingerprint=fingerprint,
                    state=state,
                    ttl_seconds=ttl_seconds,
                    pinned=pin,
                    tier=tier,
                )
            )
            return entry.summary(reusable=True)
        if tier is not Tier.DISK:
            raise Unavailable(
                f"tier {tier} has no Werk store", capability=f"runtime.state.tier.{tier}"
            )
        exported: BackendState = await self.s.pm.call_operation(
            Operation.SNAPSHOT, runtime, state=state
        )
        chain = tuple(fingerprint for _, fingerprint in prefixes())
        started = time.monotonic()
        with owned_payload(exported) as payload:
            stored = await anyio.to_thread.run_sync(
                lambda: self.s.catalog.commit(
                    principal,
                    envelope=envelope,
                    model=spec.id,
                    backend=spec.backend,
                    tier=Tier.DISK,
                    fingerprint=fingerprint,
                    payload=payload,
                    ttl_seconds=ttl_seconds,
                    pinned=pin,
                    logical_bytes=exported.logical_bytes,
                    prefixes=chain,
                    origin=origin,
                )
            )
        self.s.commit_latency.observe(time.monotonic() - started)
        return stored.summary(reusable=True)

    async def keep_continuation(
        self,
        principal: str,
        request: PrefillRequest,
        turn: DecodedTurn,
        *,
        origin: Literal["chat"] | None = None,
    ) -> tuple[StateSummary, PrefillOutcome] | None:
        """Keep ``request`` — a decoded turn's prompt with its reply — as a named state that
        continues the live state the turn decoded (``reuse: required``): a backend that still
        holds the reply's tokens there evaluates (almost) nothing more. No handoff is issued
        and no decode follows (``PrefillCall.decode`` false). ``None``, with nothing kept,
        when the backend has not proven prefix continuation for this request or no longer
        holds the turn's state. The live state a disk state was kept from is remembered for the
        conversation's next turn (:mod:`werk.control.live_kept`).
        """
        runtime, spec = turn.runtime, turn.runtime.model
        effective = effective_prefill_policy(request, self.s.config.persistence_defaults)
        policy, allow = effective.policy, effective.allow_experimental
        rows = await self.s.rows_for(spec, runtime)
        if not runtime.alive or not prefix_proven(rows, allow):
            return None
        statuses = {row.id: row.status for row in rows}
        tier = resolve_retention(policy, statuses, allow_experimental=allow)
        with self.s.runtimes.hold(runtime):
            try:
                outcome = await self._backend_prefill(
                    runtime,
                    request,
                    msgspec.structs.replace(policy, reuse=Reuse.REQUIRED),
                    keep=True,
                    reuse_from=turn.state,
                    continued=True,
                    decode=False,
                )
            except ReuseUnavailable:
                return None
            self.s.accounting.prefill(
                principal, spec.id, outcome.prompt_tokens, outcome.cached_tokens
            )
            summary = await self._keep(
                principal,
                spec,
                runtime,
                self.s.envelope_for(runtime, principal),
                self._fingerprint(principal, spec, request),
                outcome.state,
                tier,
                policy.ttl_seconds,
                policy.pin,
                prefixes=lambda: self._chain(principal, spec, request),
                origin=origin,
            )
        if summary is None:
            return None
        if summary.tier is Tier.DISK and not self.s.pm.backends[runtime.backend].states_in_process:
            self.live_kept.remember(principal, summary.id, outcome.state)
        return summary, outcome

    # -- decode ------------------------------------------------------------------------------

    async def decode(self, principal: str, request: DecodeRequest) -> DecodeResponse:
        return (await self.decode_turn(principal, request)).response

    async def decode_turn(
        self,
        principal: str,
        request: DecodeRequest,
        *,
        continues: bool = False,
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> DecodedTurn:
        """One decode, with the live state it ended in and the runtime that ran it (what
        :meth:`keep_continuation` needs to keep the reply; ``continues``: it will, so the
        backend keeps that state for it, ``DecodeCall.continues``). ``on_text`` gets the text
        as it is generated, within the 1 MiB bound (:class:`.StreamedText`); the returned text
        is the same."""
        self.s.forget_dead_generations()
        consumed = self.s.handoffs.consume(
            principal, request.handoff, generation=self.s.runtimes.generations()
        )
        with consumed:
            live: _Live = consumed.binding.payload
            runtime = self.s.runtimes.by_generation(consumed.binding.envelope.generation)
            if runtime is None or not runtime.alive:
                raise Unavailable(
                    "the runtime that produced this handoff is gone",
                    capability=CapabilityId.PD_DECODE,
                )
            rows = await self.s.rows_for(runtime.model, runtime)
            # The opt-in was given at prefill; decode accepts supported or experimental.
            gate(rows, CapabilityId.PD_DECODE, allow_experimental=True)
            state_id = consumed.binding.state_id
            copy = (
                DiskCopy(self.s, principal, state_id, runtime)
                if live.persisted and state_id is not None
                else None
            )
            stream = StreamedText(on_text) if on_text is not None else None
            with self.s.runtimes.hold(runtime), contextlib.ExitStack() as cleanup:
                if copy is not None:
                    cleanup.callback(copy.discard)
                outcome: DecodeOutcome = await self.s.pm.call_operation(
                    Operation.DECODE,
                    runtime,
                    call=DecodeCall(
                        state=live.state,
                        max_tokens=request.max_tokens,
                        temperature=request.temperature,
                        seed=request.seed,
                        stop=request.stop,
                        restore=copy.payload if copy is not None else None,
                        continues=continues,
                        on_text=stream.piece if stream is not None else None,
                    ),
                )
            text = bound_completion_text(outcome.text)
            if stream is not None:
                await stream.rest(text)
            handoff = None
            if outcome.state is not None:
                issued = consumed.replace(
                    HandoffBinding(
                        envelope=consumed.binding.envelope,
                        payload=_Live(model=live.model, state=outcome.state),
                        state_id=consumed.binding.state_id,
                    )
                )
                handoff = issued.to_protocol()
        response = DecodeResponse(
            text=text,
            finish_reason=outcome.finish_reason,
            usage=DecodeUsage(completion_tokens=outcome.completion_tokens),
            state=None,
            handoff=handoff,
        )
        ended = outcome.after if outcome.after is not None else live.state
        return DecodedTurn(response, ended, runtime)
