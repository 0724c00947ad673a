"""The conformance checks of ``werk.testing``, run against one backend through the real host.

Everything goes through the plugin manager and the in-process control service that ``werk serve``
uses (with a private temporary ``WERK_HOME``), so a backend is checked the way it will be called:

1. **registration** — the backend is registered by a loaded plugin that implements the minimum
   hooks (``werk_register_backends``, ``werk_openai``);
2. **capability rows** — before and after a runtime starts, and after the round trip: every row
   has one of the six statuses, a known id, and no ``<backend>.discovery`` failure;
3. **/v1** — a non-streamed and a streamed chat completion (the stream must end with a
   ``finish_reason``), a stream closed by the client after its first chunk (``aclose`` must
   return within a second and the next request must still be answered), and a malformed body
   (a typed Werk error, not a plain exception);
4. **state round trip** (when the plugin implements ``werk_prefill`` and ``werk_decode``) —
   prefill into a disk state (``werk_snapshot``), decode through the handoff, a second use of the
   handoff refused, prefill again with ``reuse: required`` (``werk_restore`` from the catalog,
   with backend-reported cached tokens as reuse evidence), the same continuation as the first
   decode, and a restore of a truncated payload refused with a typed error;
5. **claims** — no row may say ``supported`` or ``experimental`` unless the checks that prove it
   passed. A failure names the row.

A plain exception a plugin raises (the host turns it into ``backend_error``) and a hook that
returns the wrong type are failures too.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..backends import (
    BackendState,
    CapabilityContext,
    ModelSpec,
    Operation,
    PrefillCall,
    PrefillOutcome,
    StateKind,
)
from ..contract import MINIMUM_HOOKS
from ..control.service import LocalControlService
from ..plugins import WerkPluginManager, get_plugin_manager
from ..protocol import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DecodeRequest,
    InvalidHandoff,
    Policy,
    PrefillRequest,
    Retention,
    Reuse,
    WerkError,
    validate_capability_id,
)
from .service import local_service

__all__ = ["Check", "ConformanceError", "ConformanceReport", "check_backend"]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3
"""Long enough that every backend has whole blocks of it to reuse."""
PRINCIPAL = "p_" + "0" * 64
CLOSE_BOUND_SECONDS = 1.0
MAX_TOKENS = 8

_CLAIMS = (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL)

# Which checks prove which core rows (a claimed row whose checks did not all pass fails).
PROOFS: dict[str, tuple[str, ...]] = {
    CapabilityId.PD_PREFILL: ("prefill",),
    CapabilityId.PD_DECODE: ("prefill", "decode"),
    CapabilityId.PD_HANDOFF: ("prefill", "decode", "handoff single use"),
    CapabilityId.STATE_PERSISTENCE: ("prefill", "disk state"),
    CapabilityId.STATE_TIER_DISK: ("disk state", "restore", "corrupted restore refused"),
    CapabilityId.STATE_RESTORE: ("restore", "restored continuation", "corrupted restore refused"),
    CapabilityId.STATE_PREFIX_CACHE: ("restore",),
}


@dataclass(frozen=True)
class Check:
    """One check's outcome. ``passed=None``: not run (the reason is in ``detail``)."""

    name: str
    passed: bool | None
    detail: str = ""

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]
        return f"{mark}  {self.name}" + (f": {self.detail}" if self.detail else "")


class ConformanceError(AssertionError):
    """Raised by :meth:`ConformanceReport.raise_for_failures`; the message lists every failure."""


@dataclass
class ConformanceReport:
    """What :func:`werk.testing.conformance` found for one backend."""

    backend: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def ok(self) -> bool:
        return not self.failures

    def passed(self, name: str) -> bool:
        return any(c.name == name and c.passed for c in self.checks)

    def add(self, name: str, passed: bool | None, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return bool(passed)

    def summary(self) -> str:
        lines = [f"werk.testing: backend {self.backend!r}"]
        lines += ["  " + c.line() for c in self.checks]
        failed = len(self.failures)
        lines.append(f"  {len(self.checks) - failed} passed, {failed} failed")
        return "\n".join(lines)

    def raise_for_failures(self) -> None:
        if not self.ok:
            raise ConformanceError(self.summary())


def _describe(exc: BaseException) -> str:
    """A Werk error as ``code: message``, noting a plain exception the host contained."""
    if isinstance(exc, WerkError):
        inner = exc.__context__
        if exc.__suppress_context__ and inner is not None and not isinstance(inner, WerkError):
            return (
                f"the plugin raised a plain {type(inner).__name__} ({inner}); "
                "raise a werk.WerkError subclass instead"
            )
        return f"{exc.code.value}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


def _is_typed(exc: BaseException) -> bool:
    if not isinstance(exc, WerkError):
        return False
    inner = exc.__context__
    return not (exc.__suppress_context__ and inner is not None and not isinstance(inner, WerkError))


def _check_rows(report: ConformanceReport, when: str, rows: Sequence[object]) -> None:
    problems: list[str] = []
    for row in rows:
        if not isinstance(row, CapabilityReport):
            problems.append(f"{type(row).__name__} is not a CapabilityReport")
            continue
        try:
            validate_capability_id(row.id)
            CapabilityStatus(row.status)
        except ValueError as exc:
            problems.append(str(exc))
        if row.id.endswith(".discovery") and row.status is CapabilityStatus.UNAVAILABLE:
            problems.append(f"discovery failed: {row.reason}")
        if row.backend != report.backend:
            problems.append(f"{row.id} is reported for backend {row.backend!r}")
    ids = [row.id for row in rows if isinstance(row, CapabilityReport)]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        problems.append(f"reported twice: {', '.join(duplicated)}")
    report.add(f"capability rows ({when})", not problems, "; ".join(problems))


def _chat(model: str, *, stream: bool, content: Any = "Say hello.") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": stream,
    }


def _finish_reason(payload: Any) -> str | None:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


async def _aclose(stream: AsyncIterator[bytes]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def _check_openai(
    report: ConformanceReport, service: LocalControlService, model: str
) -> None:
    try:
        reply = await service.openai_request(
            PRINCIPAL, "chat.completions", _chat(model, stream=False)
        )
        body = reply.body
        reason = _finish_reason(body)
        report.add(
            "/v1 chat completion",
            reason is not None,
            "" if reason else "the reply has no choice with a finish_reason",
        )
    except Exception as exc:
        report.add("/v1 chat completion", False, _describe(exc))

    try:
        reply = await service.openai_request(
            PRINCIPAL, "chat.completions", _chat(model, stream=True)
        )
        assert reply.stream is not None
        reasons: list[str] = []
        chunks = 0
        try:
            async for payload in reply.stream:
                chunks += 1
                reason = _finish_reason(msgspec.json.decode(payload))
                if reason:
                    reasons.append(reason)
        finally:
            await _aclose(reply.stream)
        report.add(
            "/v1 streamed chat completion",
            bool(reasons),
            f"{chunks} chunk(s)"
            if reasons
            else f"none of {chunks} chunk(s) has a finish_reason (werk run and werk chat need one)",
        )
    except Exception as exc:
        report.add("/v1 streamed chat completion", False, _describe(exc))

    try:
        reply = await service.openai_request(
            PRINCIPAL, "chat.completions", _chat(model, stream=True)
        )
        assert reply.stream is not None
        with anyio.fail_after(30):
            await reply.stream.__anext__()
        with anyio.move_on_after(CLOSE_BOUND_SECONDS) as scope:
            await _aclose(reply.stream)
        closed = not scope.cancelled_caught
        after = await service.openai_request(
            PRINCIPAL, "chat.completions", _chat(model, stream=False)
        )
        report.add(
            "/v1 stream closed by the client",
            closed and _finish_reason(after.body) is not None,
            "" if closed else f"aclose() did not return within {CLOSE_BOUND_SECONDS:g}s",
        )
    except Exception as exc:
        report.add("/v1 stream closed by the client", False, _describe(exc))

    try:
        await service.openai_request(
            PRINCIPAL, "chat.completions", {"model": model, "messages": "not a list"}
        )
        report.add(
            "/v1 malformed request refused", False, "a body with non-list messages was answered"
        )
    except Exception as exc:
        report.add("/v1 malformed request refused", _is_typed(exc), _describe(exc))


def _truncated(payload: BackendState, scratch: Path) -> BackendState:
    if payload.kind is StateKind.BYTES and payload.data is not None:
        data = payload.data[: len(payload.data) // 2]
        return BackendState(kind=StateKind.BYTES, data=data, generation=payload.generation)
    if payload.kind is StateKind.FILE and payload.path is not None:
        data = payload.path.read_bytes()
        target = scratch / "truncated.bin"
        target.write_bytes(data[: len(data) // 2])
        return BackendState(kind=StateKind.FILE, path=target, generation=payload.generation)
    raise TypeError(f"a snapshot must be a bytes or file payload, not {payload.kind}")


async def _check_round_trip(
    report: ConformanceReport, service: LocalControlService, spec: ModelSpec, scratch: Path
) -> None:
    def request(reuse: Reuse) -> PrefillRequest:
        return PrefillRequest(
            model=spec.id,
            prompt=PROMPT,
            policy=Policy(retention=Retention.DISK, reuse=reuse),
            allow_experimental=True,
        )

    try:
        first = await service.prefill(PRINCIPAL, request(Reuse.DISABLED))
    except Exception as exc:
        report.add("prefill", False, _describe(exc))
        return
    report.add("prefill", True, f"{first.usage.prompt_tokens} prompt tokens")
    state = first.state
    report.add(
        "disk state",
        state is not None and state.tier.value == "disk",
        "" if state is not None else "retention disk kept no state",
    )
    try:
        reference = await service.decode(
            PRINCIPAL, DecodeRequest(handoff=first.handoff.token, max_tokens=MAX_TOKENS)
        )
        report.add("decode", True, f"{reference.text!r} ({reference.finish_reason})")
    except Exception as exc:
        report.add("decode", False, _describe(exc))
        return
    try:
        await service.decode(
            PRINCIPAL, DecodeRequest(handoff=first.handoff.token, max_tokens=MAX_TOKENS)
        )
        report.add("handoff single use", False, "a consumed handoff was accepted again")
    except InvalidHandoff:
        report.add("handoff single use", True)
    except Exception as exc:
        report.add("handoff single use", False, _describe(exc))

    if state is not None:
        try:
            again = await service.prefill(PRINCIPAL, request(Reuse.REQUIRED))
            cached = again.usage.cached_tokens
            report.add(
                "restore",
                again.reuse.outcome.value == "reused" and bool(cached),
                f"reuse {again.reuse.outcome.value}, {cached} cached token(s)",
            )
            restored = await service.decode(
                PRINCIPAL, DecodeRequest(handoff=again.handoff.token, max_tokens=MAX_TOKENS)
            )
            same = restored.text == reference.text
            report.add(
                "restored continuation",
                same,
                "" if same else f"{restored.text!r} after restore, {reference.text!r} before",
            )
        except Exception as exc:
            report.add("restore", False, _describe(exc))
    await _check_corrupted_restore(report, service, spec, scratch)


async def _check_corrupted_restore(
    report: ConformanceReport, service: LocalControlService, spec: ModelSpec, scratch: Path
) -> None:
    pm = service.pm
    if not (
        pm.implements(spec.backend, "werk_snapshot") and pm.implements(spec.backend, "werk_restore")
    ):
        report.add("corrupted restore refused", None, "no werk_snapshot/werk_restore hook")
        return
    try:
        runtime = await service.runtimes.get(spec)
        outcome: PrefillOutcome = await pm.call_operation(
            Operation.PREFILL, runtime, call=PrefillCall(prompt=PROMPT, keep=True)
        )
        exported: BackendState = await pm.call_operation(
            Operation.SNAPSHOT, runtime, state=outcome.state
        )
        broken = _truncated(exported, scratch)
        if exported.kind is StateKind.FILE and exported.path is not None:
            exported.path.unlink(missing_ok=True)
    except Exception as exc:
        report.add(
            "corrupted restore refused", False, f"could not export a state: {_describe(exc)}"
        )
        return
    try:
        await pm.call_operation(Operation.RESTORE, runtime, payload=broken)
        report.add("corrupted restore refused", False, "a truncated payload was restored")
    except Exception as exc:
        report.add("corrupted restore refused", _is_typed(exc), _describe(exc))


def _check_claims(report: ConformanceReport, rows: Sequence[CapabilityReport]) -> None:
    for row in rows:
        if row.status not in _CLAIMS or row.id not in PROOFS:
            continue
        needed = PROOFS[row.id]
        missing = [name for name in needed if not report.passed(name)]
        report.add(
            f"claim {row.id} {row.status}",
            not missing,
            "" if not missing else f"not proven: {', '.join(missing)} did not pass",
        )


@contextlib.contextmanager
def _private_home(home: Path | None) -> Iterator[Path]:
    if home is not None:
        yield home
        return
    with tempfile.TemporaryDirectory(prefix="werk-conformance-") as tmp:
        path = Path(tmp)
        os.chmod(path, 0o700)
        yield path


async def check_backend(
    backend: str,
    model: ModelSpec | None = None,
    *,
    pm: WerkPluginManager | None = None,
    home: Path | None = None,
    factory: Callable[[], WerkPluginManager] = get_plugin_manager,
) -> ConformanceReport:
    """Run every check against ``backend``; never raises for a failed check.

    :param backend: the backend name the plugin registers.
    :param model: the model to serve (default: a file-less model ``conformance``).
    :param pm: a plugin manager to use (default: a fresh one loading the ``werk`` entry points).
    :param home: the ``WERK_HOME`` for the in-process service (default: a private temporary
        directory, removed afterwards).
    """
    report = ConformanceReport(backend)
    manager = pm if pm is not None else factory()
    if backend not in manager.backends:
        failed = [r for r in manager.records.values() if r.status.value == "failed"]
        detail = f"no loaded plugin registers backend {backend!r}"
        if failed:
            detail += "; failed plugins: " + ", ".join(f"{r.name} ({r.error})" for r in failed)
        report.add("registration", False, detail)
        return report
    record = manager.owner_of(backend)
    missing = [hook for hook in MINIMUM_HOOKS if hook not in record.hooks]
    report.add(
        "registration",
        not missing,
        f"plugin {record.name}" + (f" lacks {', '.join(missing)}" if missing else ""),
    )
    spec = model or ModelSpec(id="conformance", backend=backend, identity="sha256:" + "0" * 64)
    _check_rows(
        report, "no runtime", manager.capabilities(CapabilityContext(backend=backend, model=spec))
    )
    with _private_home(home) as werk_home:
        async with local_service([spec], home=werk_home, pm=manager) as service:
            await _run_live(report, service, spec, werk_home)
    return report


async def _run_live(
    report: ConformanceReport, service: LocalControlService, spec: ModelSpec, home: Path
) -> None:
    pm = service.pm
    if not service.runtimes.can_start(spec.backend):
        report.add("runtime start", None, "the backend registers no start/stop")
        return
    try:
        runtime = await service.runtimes.get(spec)
        report.add("runtime start", True, f"generation {runtime.generation}")
    except Exception as exc:
        report.add("runtime start", False, _describe(exc))
        return
    _check_rows(report, "live runtime", await service.rows_for(spec, runtime))
    if pm.implements(spec.backend, "werk_openai"):
        await _check_openai(report, service, spec.id)
    if pm.implements(spec.backend, "werk_prefill") and pm.implements(spec.backend, "werk_decode"):
        scratch = home / "conformance"
        scratch.mkdir(mode=0o700, exist_ok=True)
        await _check_round_trip(report, service, spec, scratch)
    runtime = await service.runtimes.get(spec)
    rows = await service.rows_for(spec, runtime)
    _check_rows(report, "after the round trip", rows)
    _check_claims(report, rows)
