"""The conformance checks of ``werk.testing``, run against one backend through the real host.

Everything goes through the plugin manager and the in-process control service that ``werk serve``
uses (with a private temporary ``WERK_HOME``), so a backend is checked the way it will be called:

1. **registration** — the backend is registered by a loaded plugin that implements the minimum
   hooks (``werk_register_backends``, ``werk_openai``);
2. **capability rows** — before and after a runtime starts, after the round trip and after a
   restart: every row has one of the six statuses, a known id, and no ``<backend>.discovery``
   failure;
3. **/v1** (:mod:`werk.testing.v1_checks`) — chat and text completions, streamed and not (a
   stream must end with a ``finish_reason``), a stream closed by the client after its first
   chunk, and a malformed body (a typed Werk error, not a plain exception);
4. **states** (:mod:`werk.testing.state_checks`, when the plugin implements ``werk_prefill``
   and ``werk_decode``) — prefill into a disk state, decode through the handoff, its single use,
   a restore from the catalog with the same continuation, a truncated payload refused, decode's
   ``stop`` and ``seed``, and ``retention: auto``;
5. **restart** — the runtime is stopped and a new one started (a new generation); the first
   generation's disk state is asked for in the new one: restored, it must continue identically
   (always); refused, ``runtime.state.restore.cross_restart`` must not be claimed (the rows
   after the restart are read after that attempt, so a backend that proves it on first use
   has done so);
6. **experts** — ``werk_observe_experts`` answers with an ``ExpertReport``;
7. **claims** — every core row reported ``supported`` or ``experimental`` (in any generation)
   must be proven by the checks in :data:`PROOFS`; a failure names the row. A row the plugin
   claimed but the host lowered is a warning (``strict`` makes warnings fail).

A plain exception a plugin raises (the host turns it into ``backend_error``) and a hook that
returns the wrong type are failures; an exception raised in *host* code while calling the plugin
says so, with where it happened.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from ..backends import CapabilityContext, ExpertReport, ModelSpec, Operation, Runtime
from ..contract import MINIMUM_HOOKS
from ..control.service import LocalControlService
from ..plugins import WerkPluginManager, get_plugin_manager
from ..protocol import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    validate_capability_id,
)
from .describe import describe, plugin_roots
from .report import Check, ConformanceError, ConformanceReport
from .service import local_service
from .state_checks import PROMPT, StateChecks
from .v1_checks import check_v1

__all__ = [
    "PROMPT",
    "PROOFS",
    "Check",
    "ConformanceError",
    "ConformanceReport",
    "check_backend",
]

_CLAIMS = (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL)

PROOFS: dict[str, tuple[str, ...]] = {
    CapabilityId.MODEL_RESIDENCY: ("runtime start", "runtime restart"),
    CapabilityId.PD_PREFILL: ("prefill",),
    CapabilityId.PD_DECODE: ("prefill", "decode", "decode stop", "decode seed (temperature 0.9)"),
    CapabilityId.PD_HANDOFF: ("prefill", "decode", "handoff single use"),
    CapabilityId.STATE_PERSISTENCE: ("prefill", "disk state", "auto retention"),
    CapabilityId.STATE_TIER_DISK: ("disk state", "restore", "corrupted restore refused"),
    CapabilityId.STATE_RESTORE: ("restore", "restored continuation", "corrupted restore refused"),
    CapabilityId.STATE_PREFIX_CACHE: ("restore",),
    CapabilityId.STATE_RESTORE_CROSS_RESTART: ("cross-restart restore",),
    CapabilityId.STATE_RESTORE_PREFIX: ("prefix continuation",),
    CapabilityId.STATE_TIER_RAM: ("memory retention",),
    CapabilityId.EXPERTS_RESIDENCY: ("experts observed",),
}
"""Which checks prove which core rows: a row claimed ``supported``/``experimental`` whose
checks did not all pass is a failure naming the row. A claimed core row missing here
(``runtime.state.tier.vram``, the host's memory rows) fails as unprovable."""


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


def _warn_lowered(
    report: ConformanceReport,
    manager: WerkPluginManager,
    context: CapabilityContext,
    rows: Sequence[CapabilityReport],
    seen: set[tuple[str, str]],
) -> None:
    """A warning for each row the plugin claimed and the host reports weaker (once per row
    and claim): the plugin promised something its hooks cannot deliver."""
    record = manager.owner_of(context.backend)
    if "werk_capabilities" not in record.hooks:
        return
    try:
        results = manager.call_plugin(record.plugin, "werk_capabilities", context=context)
    except Exception:
        return  # the rows check reports a failing discovery
    final = {row.id: row for row in rows}
    for raw in (row for result in results if result for row in result):
        if not isinstance(raw, CapabilityReport) or raw.status not in _CLAIMS:
            continue
        shown = final.get(raw.id)
        if shown is None or shown.status is raw.status or (raw.id, raw.status) in seen:
            continue
        seen.add((raw.id, raw.status))
        report.warn(
            f"host lowered {raw.id}",
            f"the plugin claims {raw.status}, the host reports {shown.status}: {shown.reason}",
        )


def _check_claims(
    report: ConformanceReport, generations: Iterable[Sequence[CapabilityReport]]
) -> None:
    claimed: dict[tuple[str, str], None] = {}
    for rows in generations:
        for row in rows:
            if row.status in _CLAIMS and row.id.startswith("runtime."):
                claimed[(row.id, row.status.value)] = None
    for capability, status in claimed:
        needed = PROOFS.get(capability)
        if needed is None:
            report.add(
                f"claim {capability} {status}",
                False,
                "no check of the kit can prove it, and no hook of this contract provides it",
            )
            continue
        missing = [name for name in needed if not report.passed(name)]
        report.add(
            f"claim {capability} {status}",
            not missing,
            "" if not missing else f"not proven: {', '.join(missing)} did not pass",
        )


@contextlib.contextmanager
def _private_home(home: Path | None) -> Iterator[Path]:
    if home is not None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    :param model: the model to serve (default: a file-less model ``conformance``; see
        :func:`werk.testing.model_spec` for one made of files).
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
    run = _Run(report, manager, spec, plugin_roots(record.plugin))
    context = CapabilityContext(backend=backend, model=spec)
    run.rows("no runtime", manager.capabilities(context), context)
    with _private_home(home) as werk_home:
        async with local_service([spec], home=werk_home, pm=manager) as service:
            await run.live(service, werk_home)
    _check_claims(report, run.generations)
    return report


class _Run:
    """One kit run: the report, and every generation's rows for the claims check."""

    def __init__(
        self,
        report: ConformanceReport,
        manager: WerkPluginManager,
        spec: ModelSpec,
        plugin: tuple[Path, ...],
    ) -> None:
        self.report, self.manager, self.spec, self.plugin = report, manager, spec, plugin
        self.generations: list[Sequence[CapabilityReport]] = []
        self._lowered: set[tuple[str, str]] = set()

    def rows(self, when: str, rows: Sequence[CapabilityReport], context: CapabilityContext) -> None:
        _check_rows(self.report, when, rows)
        _warn_lowered(self.report, self.manager, context, rows, self._lowered)
        self.generations.append(rows)

    async def live_rows(self, when: str, service: LocalControlService, runtime: Runtime) -> None:
        rows = await service.rows_for(self.spec, runtime)
        context = CapabilityContext(backend=self.spec.backend, model=self.spec, runtime=runtime)
        self.rows(when, rows, context)

    async def live(self, service: LocalControlService, home: Path) -> None:
        report, pm, spec = self.report, service.pm, self.spec
        if not service.runtimes.can_start(spec.backend):
            report.add("runtime start", None, "the backend registers no start/stop")
            return
        try:
            runtime = await service.runtimes.get(spec)
            report.add("runtime start", True, f"generation {runtime.generation}")
        except Exception as exc:
            report.add("runtime start", False, describe(exc, self.plugin))
            return
        await self.live_rows("live runtime", service, runtime)
        if pm.implements(spec.backend, "werk_openai"):
            await check_v1(report, service, spec.id, self.plugin)
        states: StateChecks | None = None
        reference: str | None = None
        stored = False
        if pm.implements(spec.backend, "werk_prefill") and pm.implements(
            spec.backend, "werk_decode"
        ):
            scratch = home / "conformance"
            scratch.mkdir(mode=0o700, exist_ok=True)
            states = StateChecks(report, service, spec, scratch, self.plugin)
            trip = await states.round_trip()
            reference, stored = trip.reference, trip.stored
            if reference is not None:
                await states.decode_options(reference)
                await states.auto_retention()
                await states.memory_retention(reference)
        await self._observe_experts(service)
        await self.live_rows("after the round trip", service, await service.runtimes.get(spec))
        restarted = await self._restart(service, runtime)
        if restarted is None:
            return
        if states is not None and reference is not None and stored:
            await states.cross_restart(reference)
        await self.live_rows("after a restart", service, restarted)

    async def _restart(self, service: LocalControlService, first: Runtime) -> Runtime | None:
        """Stop the runtime and start a new one: its generation must differ."""
        name = "runtime restart"
        try:
            await service.runtimes.stop(self.spec.id)
            second = await service.runtimes.get(self.spec)
        except Exception as exc:
            self.report.add(name, False, describe(exc, self.plugin))
            return None
        fresh = second.generation != first.generation
        self.report.add(
            name,
            fresh,
            f"generation {first.generation} -> {second.generation}"
            + ("" if fresh else " (a new runtime must have a new generation)"),
        )
        return second

    async def _observe_experts(self, service: LocalControlService) -> None:
        pm = service.pm
        if not pm.implements(self.spec.backend, "werk_observe_experts"):
            return
        name = "experts observed"
        try:
            runtime = await service.runtimes.get(self.spec)
            observed = await pm.call_operation(Operation.OBSERVE_EXPERTS, runtime)
        except Exception as exc:
            self.report.add(name, False, describe(exc, self.plugin))
            return
        self.report.add(
            name,
            isinstance(observed, ExpertReport),
            f"{len(observed.experts)} expert(s), complete {observed.complete}",
        )
