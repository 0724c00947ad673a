"""The kit's state checks: split prefill/decode, a disk state and its restore, a longer prompt
continuing it (``runtime.state.restore.prefix``), decode's ``stop``/``seed``/``temperature``,
``auto`` and ``memory`` retention, a corrupted payload, and a restore into a later runtime
generation (``runtime.state.restore.cross_restart``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..backends import BackendState, ModelSpec, Operation, PrefillCall, PrefillOutcome, StateKind
from ..control.service import LocalControlService
from ..protocol import (
    CapabilityId,
    CapabilityStatus,
    DecodeRequest,
    DecodeResponse,
    ExperimentalOptInRequired,
    FinishReason,
    IncompatibleState,
    InvalidHandoff,
    Policy,
    PrefillRequest,
    PrefillResponse,
    Retention,
    Reuse,
    ReuseUnavailable,
    Unavailable,
    Unsupported,
)
from .describe import describe, is_typed
from .report import ConformanceReport
from .v1_checks import MAX_TOKENS, PRINCIPAL

__all__ = ["PROMPT", "RoundTrip", "StateChecks"]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
"""Long enough that every backend has whole blocks of it to reuse."""
AUTO_PROMPT = "Pack my box with five dozen liquor jugs. " * 3
GROWN_PROMPT = PROMPT * 2
"""Over one prefix boundary (256 characters): a longer prompt can continue its state."""
GROWN_TAIL = " Then the fox went home."
SAMPLED_TEMPERATURE = 0.9
SEED = 1234


@dataclass
class RoundTrip:
    """What the round trip left for later checks: the greedy continuation of :data:`PROMPT`
    and whether a disk state of it was stored."""

    reference: str | None = None
    stored: bool = False


def stop_split(text: str) -> tuple[str, str] | None:
    """``(kept, stop)``: the tail of ``text`` from a cut whose first occurrence is the cut (as
    near the middle as the text allows; a repetitive text may be cut at its start), so a
    backend honouring ``stop`` answers exactly ``kept``."""
    middle = len(text) // 2
    for k in [*range(middle, len(text)), *range(middle - 1, -1, -1)]:
        stop = text[k:]
        if stop.strip() and len(stop) <= 256 and text.find(stop) == k:
            return text[:k], stop
    return None


class StateChecks:
    """The state checks against one model, through the in-process control service."""

    def __init__(
        self,
        report: ConformanceReport,
        service: LocalControlService,
        spec: ModelSpec,
        scratch: Path,
        plugin: tuple[Path, ...] = (),
    ) -> None:
        self.report, self.service, self.spec = report, service, spec
        self.scratch, self.plugin = scratch, plugin

    def fail(self, name: str, exc: BaseException) -> None:
        self.report.add(name, False, describe(exc, self.plugin))

    async def prefill(
        self, prompt: str, retention: Retention, reuse: Reuse = Reuse.DISABLED
    ) -> PrefillResponse:
        return await self.service.prefill(
            PRINCIPAL,
            PrefillRequest(
                model=self.spec.id,
                prompt=prompt,
                policy=Policy(retention=retention, reuse=reuse),
                allow_experimental=True,
            ),
        )

    async def decode(
        self,
        first: PrefillResponse,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
    ) -> DecodeResponse:
        return await self.service.decode(
            PRINCIPAL,
            DecodeRequest(
                handoff=first.handoff.token,
                max_tokens=MAX_TOKENS,
                temperature=temperature,
                seed=seed,
                stop=stop or [],
            ),
        )

    # -- the round trip --------------------------------------------------------------------

    async def round_trip(self) -> RoundTrip:
        """Prefill into a disk state, decode, the handoff's single use, restore from the
        catalog and the same continuation, then a corrupted payload."""
        out = RoundTrip()
        try:
            first = await self.prefill(PROMPT, Retention.DISK)
        except Exception as exc:
            self.fail("prefill", exc)
            return out
        self.report.add("prefill", True, f"{first.usage.prompt_tokens} prompt tokens")
        state = first.state
        out.stored = state is not None and state.tier.value == "disk"
        self.report.add(
            "disk state", out.stored, "" if state is not None else "retention disk kept no state"
        )
        try:
            reference = await self.decode(first)
        except Exception as exc:
            self.fail("decode", exc)
            return out
        out.reference = reference.text
        self.report.add("decode", True, f"{reference.text!r} ({reference.finish_reason})")
        try:
            await self.decode(first)
            self.report.add("handoff single use", False, "a consumed handoff was accepted again")
        except InvalidHandoff:
            self.report.add("handoff single use", True)
        except Exception as exc:
            self.fail("handoff single use", exc)
        await self._streamed_decode(reference.text)
        if state is not None:
            await self._restore(reference.text)
            await self._prefix_continuation()
        await self._corrupted_restore()
        return out

    async def _streamed_decode(self, reference: str) -> None:
        """The same greedy decode with ``DecodeCall.on_text`` (a streamed persisted chat)
        answers without error — the host fails a decode whose pieces are not the start of its
        text — with the unstreamed text, and what reached the client adds up to it."""
        name = "streamed decode"
        pieces: list[str] = []

        async def on_text(piece: str) -> None:
            pieces.append(piece)

        try:
            first = await self.prefill(PROMPT, Retention.EPHEMERAL)
            request = DecodeRequest(
                handoff=first.handoff.token, max_tokens=MAX_TOKENS, temperature=0.0
            )
            turn = await self.service.flow.decode_turn(PRINCIPAL, request, on_text=on_text)
        except Exception as exc:
            self.fail(name, exc)
            return
        text = turn.response.text
        ok = "".join(pieces) == text == reference
        detail = f"{len(pieces)} piece(s)"
        if not ok:
            detail += f": {''.join(pieces)!r} streamed, {text!r} returned, {reference!r} unstreamed"
        self.report.add(name, ok, detail)

    async def _restore(self, reference: str) -> None:
        try:
            again = await self.prefill(PROMPT, Retention.DISK, Reuse.REQUIRED)
            cached = again.usage.cached_tokens
            self.report.add(
                "restore",
                again.reuse.outcome.value == "reused" and bool(cached),
                f"reuse {again.reuse.outcome.value}, {cached} cached token(s)",
            )
            restored = await self.decode(again)
        except Exception as exc:
            self.fail("restore", exc)
            return
        same = restored.text == reference
        self.report.add(
            "restored continuation",
            same,
            "" if same else f"{restored.text!r} after restore, {reference!r} before",
        )

    async def _prefix_continuation(self) -> None:
        """A disk state of :data:`GROWN_PROMPT`, then that prompt and more with ``reuse:
        prefer``: continued (``match: prefix``) with the backend's reuse, and the same text as
        a cold prefill. Not applicable where the backend does not claim
        ``runtime.state.restore.prefix`` and the host continued nothing."""
        name = "prefix continuation"
        try:
            rows = (await self.service.capabilities(model=self.spec.id)).capabilities
            claimed = any(
                r.id == CapabilityId.STATE_RESTORE_PREFIX
                and r.status in (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL)
                for r in rows
            )
            saved = await self.prefill(GROWN_PROMPT, Retention.DISK)
            await self.decode(saved)  # its handoff ends; the state stays on disk
            grown = await self.prefill(GROWN_PROMPT + GROWN_TAIL, Retention.EPHEMERAL, Reuse.PREFER)
            if grown.reuse.match is None and not claimed:
                await self.decode(grown)
                self.report.add(name, None, "not claimed; the host continued nothing")
                return
            continued = await self.decode(grown)
            cold = await self.decode(
                await self.prefill(GROWN_PROMPT + GROWN_TAIL, Retention.EPHEMERAL)
            )
        except Exception as exc:
            self.fail(name, exc)
            return
        reuse, usage = grown.reuse, grown.usage
        problems = []
        if reuse.match is None or reuse.match.value != "prefix" or saved.state is None:
            problems.append(f"reuse {reuse.outcome.value}, match {reuse.match}")
        elif reuse.state_id != saved.state.id:
            problems.append("continued another state than the one saved")
        if not usage.cached_tokens or not usage.evaluated_tokens:
            problems.append(f"{usage.cached_tokens} reused, {usage.evaluated_tokens} evaluated")
        if continued.text != cold.text:
            problems.append(f"{continued.text!r} continued, {cold.text!r} cold")
        self.report.add(
            name,
            not problems,
            "; ".join(problems)
            or f"{usage.cached_tokens} tokens reused, {usage.evaluated_tokens} evaluated",
        )

    async def _corrupted_restore(self) -> None:
        name = "corrupted restore refused"
        pm, spec = self.service.pm, self.spec
        if not (
            pm.implements(spec.backend, "werk_snapshot")
            and pm.implements(spec.backend, "werk_restore")
        ):
            self.report.add(name, None, "no werk_snapshot/werk_restore hook")
            return
        try:
            runtime = await self.service.runtimes.get(spec)
            outcome: PrefillOutcome = await pm.call_operation(
                Operation.PREFILL, runtime, call=PrefillCall(prompt=PROMPT, keep=True)
            )
            exported: BackendState = await pm.call_operation(
                Operation.SNAPSHOT, runtime, state=outcome.state
            )
            broken = self._truncated(exported)
            if exported.kind is StateKind.FILE and exported.path is not None:
                exported.path.unlink(missing_ok=True)
        except Exception as exc:
            self.report.add(name, False, f"could not export a state: {describe(exc, self.plugin)}")
            return
        try:
            await pm.call_operation(Operation.RESTORE, runtime, payload=broken)
            self.report.add(name, False, "a truncated payload was restored")
        except Exception as exc:
            self.report.add(name, is_typed(exc), describe(exc, self.plugin))

    def _truncated(self, payload: BackendState) -> BackendState:
        if payload.kind is StateKind.BYTES and payload.data is not None:
            data = payload.data[: len(payload.data) // 2]
            return BackendState(kind=StateKind.BYTES, data=data, generation=payload.generation)
        if payload.kind is StateKind.FILE and payload.path is not None:
            data = payload.path.read_bytes()
            target = self.scratch / "truncated.bin"
            target.write_bytes(data[: len(data) // 2])
            return BackendState(kind=StateKind.FILE, path=target, generation=payload.generation)
        raise TypeError(f"a snapshot must be a bytes or file payload, not {payload.kind}")

    # -- decode options and auto retention --------------------------------------------------

    async def decode_options(self, reference: str) -> None:
        """``stop`` cuts the greedy continuation where the stop string begins (finish reason
        ``stop``); two decodes at temperature 0.9 with the same ``seed`` agree."""
        split = stop_split(reference)
        if split is None:
            self.report.add(
                "decode stop", None, f"the continuation {reference!r} is too short to cut"
            )
        else:
            kept, stop = split
            try:
                cut = await self.decode(
                    await self.prefill(PROMPT, Retention.EPHEMERAL), stop=[stop]
                )
                ok = cut.text == kept and cut.finish_reason == FinishReason.STOP
                self.report.add(
                    "decode stop",
                    ok,
                    f"stop {stop!r}: {cut.text!r} ({cut.finish_reason})"
                    + ("" if ok else f"; expected {kept!r} (stop)"),
                )
            except Exception as exc:
                self.fail("decode stop", exc)
        name = f"decode seed (temperature {SAMPLED_TEMPERATURE:g})"
        try:
            texts = [
                (
                    await self.decode(
                        await self.prefill(PROMPT, Retention.EPHEMERAL),
                        temperature=SAMPLED_TEMPERATURE,
                        seed=SEED,
                    )
                ).text
                for _ in range(2)
            ]
        except Exception as exc:
            self.fail(name, exc)
            return
        self.report.add(
            name,
            texts[0] == texts[1],
            f"seed {SEED}: {texts[0]!r}" + ("" if texts[0] == texts[1] else f" then {texts[1]!r}"),
        )

    async def auto_retention(self) -> None:
        """``retention: auto`` keeps a named state (disk when the backend can, else in
        memory) that a later prefill of the same prompt reuses, with the same continuation."""
        name = "auto retention"
        try:
            first = await self.prefill(AUTO_PROMPT, Retention.AUTO)
            if first.state is None:
                self.report.add(name, False, "retention auto kept no named state")
                return
            tier = first.state.tier.value
            reference = await self.decode(first)
            again = await self.prefill(AUTO_PROMPT, Retention.AUTO, Reuse.REQUIRED)
            restored = await self.decode(again)
        except Exception as exc:
            self.fail(name, exc)
            return
        ok = again.reuse.outcome.value == "reused" and restored.text == reference.text
        self.report.add(
            name,
            ok,
            f"a {tier} state, reuse {again.reuse.outcome.value}"
            + (
                ""
                if restored.text == reference.text
                else f", {restored.text!r} after reuse, {reference.text!r} before"
            ),
        )

    async def memory_retention(self, reference: str) -> None:
        """``retention: memory`` keeps a named state of tier ``ram`` (a backend whose states live
        in ``werk serve``) that continues like the round trip's state and is reused by a later
        prefill. A refusal is no failure by itself: the claims check fails it only where the
        backend claims ``runtime.state.tier.ram``."""
        name = "memory retention"
        try:
            first = await self.prefill(PROMPT, Retention.MEMORY)
        except (Unsupported, Unavailable, ExperimentalOptInRequired) as exc:
            self.report.add(name, None, f"refused: {describe(exc, self.plugin)}")
            return
        except Exception as exc:
            self.fail(name, exc)
            return
        try:
            tier = first.state.tier.value if first.state is not None else None
            kept = await self.decode(first)
            again = await self.prefill(PROMPT, Retention.MEMORY, Reuse.REQUIRED)
            reused = await self.decode(again)
        except Exception as exc:
            self.fail(name, exc)
            return
        ok = (
            tier == "ram"
            and kept.text == reference
            and again.reuse.outcome.value == "reused"
            and reused.text == reference
        )
        self.report.add(
            name,
            ok,
            f"a {tier} state, reuse {again.reuse.outcome.value}"
            + (
                ""
                if kept.text == reused.text == reference
                else f"; {kept.text!r} then {reused.text!r}, {reference!r} from disk"
            ),
        )

    # -- across a restart -------------------------------------------------------------------

    async def cross_restart(self, reference: str) -> None:
        """In a new runtime generation, the disk state of :data:`PROMPT` saved by the earlier
        one is asked for (``reuse: required``). Restored, it must continue as it did there; a
        refusal (``incompatible_state``) is no failure by itself: the claims check fails it
        only where the backend claims ``runtime.state.restore.cross_restart``."""
        name = "cross-restart restore"
        try:
            again = await self.prefill(PROMPT, Retention.DISK, Reuse.REQUIRED)
        except (IncompatibleState, ReuseUnavailable) as exc:
            self.report.add(name, None, f"refused: {describe(exc, self.plugin)}")
            return
        except Exception as exc:
            self.fail(name, exc)
            return
        try:
            restored = await self.decode(again)
        except Exception as exc:
            self.fail(name, exc)
            return
        ok = again.reuse.outcome.value == "reused" and restored.text == reference
        self.report.add(
            name,
            ok,
            f"reuse {again.reuse.outcome.value}, {again.usage.cached_tokens} cached token(s)"
            + (
                ""
                if restored.text == reference
                else f", {restored.text!r} in the new generation, {reference!r} in the first"
            ),
        )
