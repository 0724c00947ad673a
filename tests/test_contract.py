"""Backend contract 1.1 on the host side: rows the host fills, claims it lowers, bounded
discovery and typed results of operation hooks (``werk.contract``, ``werk.plugins``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import anyio
import pytest

import werk
from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ModelSpec,
    Operation,
    PrefillCall,
    Runtime,
    hookimpl,
)
from werk.contract import HOOK_CAPABILITIES, complete_rows

SPEC = ModelSpec(id="m", backend="b", identity="sha256:" + "2" * 64)


async def _start(spec: ModelSpec) -> Runtime:
    return Runtime(backend=spec.backend, model=spec, generation="g_1")


async def _stop(runtime: Runtime) -> None:
    runtime.alive = False


def _by_id(rows: list[CapabilityReport]) -> dict[str, CapabilityReport]:
    assert len({r.id for r in rows}) == len(rows), "a row id appears twice"
    return {r.id: r for r in rows}


# -- complete_rows ------------------------------------------------------------------------------


def test_a_plugin_without_state_hooks_gets_every_state_row_unsupported_naming_the_hook() -> None:
    rows = _by_id(complete_rows([], hooks=[], backend="b", model="m", can_start=True))
    assert set(rows) == {c.value for c in HOOK_CAPABILITIES}
    assert all(r.status is CapabilityStatus.UNSUPPORTED for r in rows.values())
    assert rows[CapabilityId.STATE_RESTORE].reason == "backend 'b' implements no werk_restore hook"
    assert "werk_prefill or werk_decode" in (rows[CapabilityId.PD_HANDOFF].reason or "")
    assert "no hook" in (rows[CapabilityId.STATE_TIER_RAM].reason or "")
    assert {(r.backend, r.model) for r in rows.values()} == {("b", "m")}
    # Residency is the plugin's to report when it can start runtimes: nothing is invented.
    assert CapabilityId.MODEL_RESIDENCY not in rows


def test_a_ram_tier_claim_is_kept_only_for_a_backend_whose_states_are_in_werk() -> None:
    claim = [
        CapabilityReport(
            id=CapabilityId.STATE_TIER_RAM, status=CapabilityStatus.EXPERIMENTAL, reason="probed"
        )
    ]
    hooks = ["werk_prefill", "werk_decode"]

    def row(**kw: bool) -> CapabilityReport:
        rows = complete_rows(claim, hooks=(kw.pop("hooks", True) and hooks) or [], backend="b",
                             model="m", can_start=True, **kw)  # fmt: skip
        return _by_id(rows)[CapabilityId.STATE_TIER_RAM]

    assert row(states_in_process=True).status is CapabilityStatus.EXPERIMENTAL
    assert row(states_in_process=False).status is CapabilityStatus.UNSUPPORTED
    lowered = row(states_in_process=True, hooks=False)
    assert lowered.status is CapabilityStatus.UNSUPPORTED
    assert "no hook" in (lowered.reason or "")


def test_a_backend_that_cannot_start_is_not_resident() -> None:
    rows = _by_id(complete_rows([], hooks=[], backend="b", model=None, can_start=False))
    row = rows[CapabilityId.MODEL_RESIDENCY]
    assert row.status is CapabilityStatus.UNSUPPORTED and "start/stop" in (row.reason or "")


def test_rows_a_plugin_can_serve_but_does_not_report_stay_absent() -> None:
    hooks = ["werk_prefill", "werk_decode"]
    rows = _by_id(complete_rows([], hooks=hooks, backend="b", model="m", can_start=True))
    for capability in (CapabilityId.PD_PREFILL, CapabilityId.PD_DECODE, CapabilityId.PD_HANDOFF):
        assert capability not in rows
    assert rows[CapabilityId.STATE_PERSISTENCE].status is CapabilityStatus.UNSUPPORTED


@pytest.mark.parametrize("claim", [CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL])
def test_a_claim_without_its_hook_is_lowered_to_unsupported(claim: CapabilityStatus) -> None:
    reported = [
        CapabilityReport(id=CapabilityId.STATE_RESTORE, status=claim, backend="b", reason="x"),
        CapabilityReport(id=CapabilityId.STATE_TIER_VRAM, status=claim, backend="b", reason="x"),
    ]
    rows = _by_id(
        complete_rows(reported, hooks=["werk_snapshot"], backend="b", model=None, can_start=True)
    )
    restore = rows[CapabilityId.STATE_RESTORE]
    assert restore.status is CapabilityStatus.UNSUPPORTED
    assert restore.reason == f"the plugin claimed {claim}, but backend 'b' implements no " + (
        "werk_restore hook"
    )
    assert rows[CapabilityId.STATE_TIER_VRAM].status is CapabilityStatus.UNSUPPORTED


def test_weaker_and_hookless_statuses_are_kept_as_the_plugin_said() -> None:
    reported = [
        CapabilityReport(
            id=CapabilityId.STATE_PREFIX_CACHE,
            status=CapabilityStatus.EXTERNALLY_MANAGED,
            backend="b",
            operations=["automatic_reuse"],
            reason="vLLM owns it",
        ),
        CapabilityReport(
            id=CapabilityId.PD_PREFILL, status=CapabilityStatus.UNAVAILABLE, backend="b", reason="r"
        ),
        CapabilityReport(id="b.extra", status=CapabilityStatus.SUPPORTED, backend="b"),
    ]
    rows = _by_id(complete_rows(reported, hooks=[], backend="b", model=None, can_start=True))
    assert rows[CapabilityId.STATE_PREFIX_CACHE] == reported[0]
    assert rows[CapabilityId.PD_PREFILL] == reported[1]
    assert rows["b.extra"] == reported[2]


def test_a_claim_with_its_hooks_is_kept() -> None:
    row = CapabilityReport(
        id=CapabilityId.STATE_TIER_DISK,
        status=CapabilityStatus.EXPERIMENTAL,
        backend="b",
        reason="p",
    )
    hooks = ["werk_snapshot", "werk_restore"]
    rows = _by_id(complete_rows([row], hooks=hooks, backend="b", model=None, can_start=True))
    assert rows[CapabilityId.STATE_TIER_DISK] == row


def test_the_plugin_manager_completes_rows_of_the_real_bundled_plugins() -> None:
    pm = werk.get_plugin_manager(environ={})
    rows = _by_id(pm.capabilities(CapabilityContext(backend="media")))
    # werk-media writes no unsupported rows itself (contract 1.1); the host supplies them.
    assert rows[CapabilityId.PD_PREFILL].status is CapabilityStatus.UNSUPPORTED
    assert "werk_prefill" in (rows[CapabilityId.PD_PREFILL].reason or "")
    assert rows[CapabilityId.EXPERTS_RESIDENCY].status is CapabilityStatus.UNSUPPORTED


# -- bounded discovery --------------------------------------------------------------------------


class Sleepy:
    """A capability hook that blocks its thread, recording where it ran."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.threads: list[int] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="b", start=_start, stop=_stop))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        self.threads.append(threading.get_ident())
        time.sleep(self.seconds)
        return [
            CapabilityReport(id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.SUPPORTED)
        ]


@pytest.mark.anyio
async def test_bounded_discovery_runs_off_the_event_loop() -> None:
    plugin = Sleepy(0.0)
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sleepy", plugin)])
    rows = await pm.capabilities_bounded(CapabilityContext(backend="b", model=SPEC))
    assert plugin.threads and plugin.threads[0] != threading.get_ident()
    assert _by_id(rows)[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED


@pytest.mark.anyio
async def test_a_slow_discovery_becomes_an_unavailable_row_within_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sleepy", Sleepy(2.0))])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="werk.plugins"):
        rows = await pm.capabilities_bounded(
            CapabilityContext(backend="b", model=SPEC), timeout=0.2
        )
    assert time.monotonic() - started < 1.5
    by_id = _by_id(rows)
    discovery = by_id["b.discovery"]
    assert discovery.status is CapabilityStatus.UNAVAILABLE
    assert discovery.reason == "capability discovery did not answer within 0.2s"
    assert discovery.model == "m"
    # Hook-less rows are still there; nothing the plugin might say is invented.
    assert by_id[CapabilityId.STATE_RESTORE].status is CapabilityStatus.UNSUPPORTED
    assert CapabilityId.MODEL_RESIDENCY not in by_id
    assert any("longer than" in r.getMessage() for r in caplog.records)


@pytest.mark.anyio
async def test_a_hung_discovery_is_not_asked_again_until_it_finishes() -> None:
    """A plugin that hangs costs one worker thread, not one per request; calls that answer in
    time still run side by side."""
    plugin = Sleepy(1.0)
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("sleepy", plugin)])
    context = CapabilityContext(backend="b", model=SPEC)
    first = await pm.capabilities_bounded(context, timeout=0.1)
    second = await pm.capabilities_bounded(context, timeout=0.1)
    assert _by_id(first)["b.discovery"].reason == "capability discovery did not answer within 0.1s"
    assert _by_id(second)["b.discovery"].reason == (
        "an earlier capability discovery has not finished yet"
    )
    assert len(plugin.threads) == 1
    await anyio.sleep(1.2)  # the first call has finished: the next one asks the plugin again
    plugin.seconds = 0.0
    third = await pm.capabilities_bounded(context, timeout=1.0)
    assert _by_id(third)[CapabilityId.MODEL_RESIDENCY].status is CapabilityStatus.SUPPORTED
    assert len(plugin.threads) == 2
    plugin.seconds = 0.3  # slow but in time: concurrent calls all reach the plugin
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(pm.capabilities_bounded, context)
    assert len(plugin.threads) == 5


# -- operation results ---------------------------------------------------------------------------


class WrongTypes:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="b"))

    @hookimpl
    def werk_prefill(self, runtime: Runtime, call: PrefillCall) -> object:
        return {"state": "not a PrefillOutcome"}

    @hookimpl
    async def werk_snapshot(self, runtime: Runtime, state: object) -> object:
        return b"raw bytes instead of a BackendState"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("operation", "kwargs", "returned", "expected"),
    [
        (Operation.PREFILL, {"call": PrefillCall(prompt="x")}, "dict", "PrefillOutcome"),
        (Operation.SNAPSHOT, {"state": None}, "bytes", "BackendState"),
    ],
)
async def test_a_wrong_result_type_is_a_backend_error_naming_plugin_and_hook(
    operation: Operation, kwargs: dict[str, object], returned: str, expected: str
) -> None:
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("wrong-types", WrongTypes())])
    runtime = Runtime(backend="b", model=SPEC, generation="g_1")
    with pytest.raises(werk.BackendError) as caught:
        await pm.call_operation(operation, runtime, **kwargs)
    assert caught.value.message == (
        f"plugin 'wrong-types' returned {returned} from {operation.value}, not a werk.{expected}"
    )
    assert caught.value.code.value == "backend_error"


def test_the_anyio_bound_is_real() -> None:
    """The bound relies on abandoning the worker thread; the anyio in use must support it."""

    async def main() -> bool:
        with anyio.move_on_after(0.05) as scope:
            await anyio.to_thread.run_sync(time.sleep, 0.5, abandon_on_cancel=True)
        return scope.cancelled_caught

    assert anyio.run(main)
