"""Composing the capability matrix, and the accelerator telemetry it is partly built from."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

import werk
from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ModelSpec,
    Runtime,
    hookimpl,
)
from werk.capabilities import compose_capabilities, host_capabilities
from werk.memory import telemetry
from werk.memory.telemetry import AcceleratorSample, sample_accelerators
from werk.protocol import AcceleratorMemory

MakePM = Callable[..., werk.WerkPluginManager]

SIX_STATUSES = {
    "supported",
    "unsupported",
    "unavailable",
    "experimental",
    "externally_managed",
    "metadata_only",
}
HOST = CapabilityId.MEMORY_TELEMETRY_HOST.value
ACCEL = CapabilityId.MEMORY_TELEMETRY_ACCELERATOR.value
RESERVE = CapabilityId.MEMORY_RESERVATIONS.value
HOST_ROWS = [HOST, ACCEL, RESERVE]


def _spec(model: str, backend: str) -> ModelSpec:
    return ModelSpec(id=model, backend=backend, identity="sha256:" + "1" * 64)


def _by_id(rows: Sequence[CapabilityReport]) -> dict[str, CapabilityReport]:
    return {r.id: r for r in rows}


def _filled_by_host(row: CapabilityReport) -> bool:
    """A row the host added because the plugin lacks the hooks for it (tests/test_contract.py)."""
    reason = row.reason or ""
    return row.status is CapabilityStatus.UNSUPPORTED and (
        " implements no " in reason or "has no hook" in reason or "registers no start" in reason
    )


def _reported(rows: Sequence[CapabilityReport], backend: str) -> list[CapabilityReport]:
    return [r for r in rows if r.backend == backend and not _filled_by_host(r)]


def _assert_truthful(rows: Sequence[CapabilityReport]) -> None:
    for row in rows:
        assert row.status.value in SIX_STATUSES
        if row.status is not CapabilityStatus.SUPPORTED:
            assert row.reason, (
                f"{row.id} ({row.backend}, {row.model}) is {row.status} without reason"
            )


def _nvml_device_count() -> int | None:
    """Ask NVML directly (not through werk): ``None`` when it cannot even initialise."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


# ------------------------------------------------------------------------------------------------
# Host rows
# ------------------------------------------------------------------------------------------------


def test_host_rows_reflect_this_machine() -> None:
    rows = _by_id(host_capabilities())
    assert set(rows) == {HOST, ACCEL}
    assert rows[HOST].status is CapabilityStatus.SUPPORTED  # psutil works on every CI host
    assert rows[HOST].operations == ["sample"]
    count = _nvml_device_count()
    if count:
        assert rows[ACCEL].status is CapabilityStatus.SUPPORTED
    else:
        # No NVML library (this development machine) or no device: say so, never "supported".
        assert rows[ACCEL].status is CapabilityStatus.UNAVAILABLE
        assert "NVML" in (rows[ACCEL].reason or "")
    for row in rows.values():
        assert row.backend is None and row.model is None
    _assert_truthful(list(rows.values()))


def test_accelerator_row_supported_with_an_injected_sample() -> None:
    device = AcceleratorMemory(index=0, name="Fake GPU", total_bytes=80 << 30, used_bytes=1 << 30)
    rows = _by_id(host_capabilities(accelerators=lambda: AcceleratorSample([device])))
    assert rows[ACCEL].status is CapabilityStatus.SUPPORTED
    assert rows[ACCEL].operations == ["sample"]


def test_accelerator_row_unavailable_when_sampled_none_present() -> None:
    sample = AcceleratorSample([], "NVML reports no devices")
    rows = _by_id(host_capabilities(accelerators=lambda: sample))
    assert rows[ACCEL].status is CapabilityStatus.UNAVAILABLE
    assert rows[ACCEL].reason == "NVML reports no devices"


def test_accelerator_row_unavailable_without_a_reason_still_explains() -> None:
    rows = _by_id(host_capabilities(accelerators=lambda: AcceleratorSample(None)))
    assert rows[ACCEL].status is CapabilityStatus.UNAVAILABLE
    assert rows[ACCEL].reason


def test_host_row_unavailable_when_psutil_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise telemetry.TelemetryError("host memory sampling failed: OSError")

    monkeypatch.setattr("werk.capabilities.sample_host", broken)
    rows = _by_id(host_capabilities(accelerators=lambda: AcceleratorSample([])))
    assert rows[HOST].status is CapabilityStatus.UNAVAILABLE
    assert rows[HOST].reason == "host memory sampling failed: OSError"


# ------------------------------------------------------------------------------------------------
# Composition
# ------------------------------------------------------------------------------------------------


class Reporter:
    """A backend that reports one supported and one unavailable row and records its contexts."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.contexts: list[CapabilityContext] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name=self.backend))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        self.contexts.append(context)
        return [
            CapabilityReport(id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.SUPPORTED),
            CapabilityReport(
                id=CapabilityId.PD_PREFILL,
                status=CapabilityStatus.UNAVAILABLE,
                operations=["prefill"],
                reason="no process",
            ),
            CapabilityReport(
                id=f"{self.backend}.slots", status=CapabilityStatus.METADATA_ONLY, reason="info"
            ),
        ]


class Explodes:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="boom"))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        raise ConnectionError("probe endpoint refused with secret-ish detail")


class InvalidId:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="rogue"))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        # Redefining the runtime. namespace is refused when the row is built.
        return [CapabilityReport(id="runtime.teleport", status=CapabilityStatus.SUPPORTED)]


class Silent:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="silent"))


NO_GPU = lambda: AcceleratorSample(None, "test: no accelerator")  # noqa: E731


def test_composed_matrix_of_the_installed_plugins() -> None:
    pm = werk.get_plugin_manager(environ={})
    rows = compose_capabilities(pm)
    _assert_truthful(rows)
    ids = [r.id for r in rows]
    assert ids[:3] == HOST_ROWS  # host rows first
    backends = {r.backend for r in rows[3:]}
    assert {"llamacpp", "vllm", "vllm-remote", "omlx", "media"} <= backends
    assert all(r.model is None for r in rows)  # no models configured: backend-wide rows


def test_backend_wide_rows_are_filled_with_the_backend(make_pm: MakePM) -> None:
    reporter = Reporter("echo")
    rows = compose_capabilities(make_pm(("echo", reporter)), accelerators=NO_GPU)
    _assert_truthful(rows)
    backend_rows = _reported(rows, "echo")
    assert [(r.id, r.backend, r.model) for r in backend_rows] == [
        ("runtime.model_residency", "echo", None),
        ("runtime.pd.prefill", "echo", None),
        ("echo.slots", "echo", None),
    ]
    assert backend_rows[1].operations == ["prefill"]
    assert reporter.contexts == [CapabilityContext(backend="echo")]


def test_configured_models_get_per_model_rows(make_pm: MakePM) -> None:
    echo, other = Reporter("echo"), Reporter("other")
    pm = make_pm(("echo", echo), ("other", other))
    models = [_spec("m1", "echo"), _spec("m2", "echo")]
    live = Runtime(backend="echo", model=models[0], generation="g_live")
    rows = compose_capabilities(pm, models, {"m1": live}, accelerators=NO_GPU)
    _assert_truthful(rows)
    echo_rows = _reported(rows, "echo")
    assert {r.model for r in echo_rows} == {"m1", "m2"}
    assert len(echo_rows) == 6
    assert all(r.model in ("m1", "m2") for r in rows if r.backend == "echo")
    assert [(c.model, c.runtime) for c in echo.contexts] == [(models[0], live), (models[1], None)]
    # A backend without configured models still reports its backend-wide rows.
    assert {r.model for r in rows if r.backend == "other"} == {None}


def test_model_filter_keeps_host_rows_and_one_model(make_pm: MakePM) -> None:
    echo, other = Reporter("echo"), Reporter("other")
    pm = make_pm(("echo", echo), ("other", other))
    models = [_spec("m1", "echo"), _spec("m2", "echo"), _spec("x", "other")]
    rows = compose_capabilities(pm, models, model="m2", accelerators=NO_GPU)
    assert [r.id for r in rows[:3]] == HOST_ROWS
    rest = rows[3:]
    assert rest and {(r.backend, r.model) for r in rest} == {("echo", "m2")}
    assert other.contexts == []


def test_unknown_model_is_not_found(make_pm: MakePM) -> None:
    pm = make_pm(("echo", Reporter("echo")))
    with pytest.raises(werk.NotFound, match="nope"):
        compose_capabilities(pm, [_spec("m1", "echo")], model="nope", accelerators=NO_GPU)
    with pytest.raises(werk.NotFound):
        compose_capabilities(pm, model="m1", accelerators=NO_GPU)


def test_raising_plugin_yields_one_discovery_row(
    make_pm: MakePM, caplog: pytest.LogCaptureFixture
) -> None:
    reporter = Reporter("echo")
    pm = make_pm(("boom", Explodes()), ("echo", reporter))
    with caplog.at_level(logging.WARNING, logger="werk.plugins"):
        rows = compose_capabilities(pm, [_spec("m", "boom")], accelerators=NO_GPU)
    _assert_truthful(rows)
    boom = _reported(rows, "boom")
    assert len(boom) == 1
    assert boom[0].id == "boom.discovery"
    assert boom[0].status is CapabilityStatus.UNAVAILABLE
    assert boom[0].model == "m"
    assert boom[0].reason == "capability discovery raised ConnectionError"
    assert "secret-ish" not in (boom[0].reason or "")
    assert len(_reported(rows, "echo")) == 3  # the others are unaffected
    warnings = [r for r in caplog.records if "boom" in r.getMessage()]
    assert warnings and not any(r.exc_info for r in warnings)  # no traceback unless tracing
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="werk.plugins"):
        compose_capabilities(pm, [_spec("m", "boom")], accelerators=NO_GPU)
    assert any(r.exc_info for r in caplog.records if "boom" in r.getMessage())


def test_invalid_capability_id_from_a_plugin_becomes_a_discovery_row(make_pm: MakePM) -> None:
    pm = make_pm(("rogue", InvalidId()), ("echo", Reporter("echo")))
    rows = compose_capabilities(pm, accelerators=NO_GPU)
    assert [r.id for r in _reported(rows, "rogue")] == ["rogue.discovery"]
    assert not any(r.id == "runtime.teleport" for r in rows)


class ReturnsJunk:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="junk"))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[Any]:
        return [{"id": "runtime.pd.prefill", "status": "supported"}]


def test_malformed_row_from_a_plugin_becomes_a_discovery_row(make_pm: MakePM) -> None:
    pm = make_pm(("junk", ReturnsJunk()), ("echo", Reporter("echo")))
    rows = compose_capabilities(pm, accelerators=NO_GPU)
    junk = _reported(rows, "junk")
    assert [(r.id, r.status.value) for r in junk] == [("junk.discovery", "unavailable")]
    assert junk[0].reason == "capability discovery raised TypeError"
    # The claimed `supported` prefill row is not among the host's rows either.
    assert not any(r.id == "runtime.pd.prefill" and r.status.value == "supported" for r in rows)
    assert len(_reported(rows, "echo")) == 3


def test_backend_without_capability_hook_gets_only_the_host_filled_rows(make_pm: MakePM) -> None:
    rows = compose_capabilities(make_pm(("silent", Silent())), accelerators=NO_GPU)
    assert [r.id for r in rows[:3]] == HOST_ROWS
    silent = rows[3:]
    assert silent and all(_filled_by_host(r) and r.backend == "silent" for r in silent)
    assert _reported(rows, "silent") == []


def test_capabilities_go_only_to_the_owner(make_pm: MakePM) -> None:
    a, b = Reporter("a"), Reporter("b")
    pm = make_pm(("a", a), ("b", b))
    rows = pm.capabilities(CapabilityContext(backend="a"))
    assert {r.backend for r in rows} == {"a"}
    assert len(a.contexts) == 1 and b.contexts == []


def test_matrix_is_recomposed_on_every_call(make_pm: MakePM) -> None:
    reporter = Reporter("echo")
    pm = make_pm(("echo", reporter))
    compose_capabilities(pm, accelerators=NO_GPU)
    compose_capabilities(pm, accelerators=NO_GPU)
    assert len(reporter.contexts) == 2


# ------------------------------------------------------------------------------------------------
# NVML sampling with an injected library
# ------------------------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """The slice of pynvml's API that sample_accelerators uses, with call accounting."""

    def __init__(
        self,
        devices: Sequence[tuple[Any, int, int]] = (),
        *,
        init_error: Exception | None = None,
        memory_error_at: int | None = None,
        shutdown_error: Exception | None = None,
    ) -> None:
        self.devices = list(devices)
        self.init_error = init_error
        self.memory_error_at = memory_error_at
        self.shutdown_error = shutdown_error
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        if self.shutdown_error is not None:
            raise self.shutdown_error

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> Any:
        return self.devices[handle][0]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        if handle == self.memory_error_at:
            raise FakeNVMLError("GPU is lost")
        _, total, used = self.devices[handle]
        return SimpleNamespace(total=total, used=used, free=total - used)


def test_two_discrete_devices() -> None:
    nvml = FakeNVML([(b"NVIDIA H200", 141 << 30, 2 << 30), ("NVIDIA L4", 24 << 30, 0)])
    sample = sample_accelerators(nvml)
    assert sample.reason is None
    assert sample.devices == [
        AcceleratorMemory(index=0, name="NVIDIA H200", total_bytes=141 << 30, used_bytes=2 << 30),
        AcceleratorMemory(index=1, name="NVIDIA L4", total_bytes=24 << 30, used_bytes=0),
    ]
    # NVML is initialised once per process, not per sample, and stays up between samples.
    assert (nvml.inits, nvml.shutdowns) == (1, 0)
    assert sample_accelerators(nvml).devices == sample.devices
    assert (nvml.inits, nvml.shutdowns) == (1, 0)
    telemetry.shutdown_nvml()  # what runs at exit
    assert nvml.shutdowns == 1


def test_nvml_init_failure_is_a_reason_not_an_exception() -> None:
    nvml = FakeNVML(init_error=FakeNVMLError("NVML Shared Library Not Found"))
    sample = sample_accelerators(nvml)
    assert sample.devices is None
    assert sample.reason == "NVML did not initialise: NVML Shared Library Not Found"
    # NVML was never initialised, so there is nothing to shut down.
    assert (nvml.inits, nvml.shutdowns) == (1, 0)


def test_zero_devices_is_an_empty_list() -> None:
    nvml = FakeNVML([])
    sample = sample_accelerators(nvml)
    assert sample.devices == []
    assert sample.reason == "NVML reports no devices"
    assert nvml.shutdowns == 0  # initialised once, kept for the next sample


def test_failure_mid_sample_shuts_down_and_the_next_sample_starts_afresh() -> None:
    nvml = FakeNVML([(b"A", 1, 0), (b"B", 1, 0)], memory_error_at=1)
    sample = sample_accelerators(nvml)
    assert sample.devices is None  # never a partial list that looks like "one device"
    assert sample.reason == "NVML sampling failed: GPU is lost"
    assert nvml.shutdowns == 1
    nvml.memory_error_at = None
    assert sample_accelerators(nvml).devices is not None
    assert nvml.inits == 2


def test_shutdown_failure_at_exit_is_swallowed() -> None:
    nvml = FakeNVML([(b"A", 10, 5)], shutdown_error=FakeNVMLError("already shut down"))
    sample = sample_accelerators(nvml)
    assert sample.devices is not None and [d.name for d in sample.devices] == ["A"]
    telemetry.shutdown_nvml()
    assert nvml.shutdowns == 1


def test_missing_pynvml_module_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(telemetry, "_load_nvml", no_module)
    sample = sample_accelerators()
    assert sample.devices is None
    assert sample.reason == "pynvml is not importable: No module named 'pynvml'"


def test_reason_text_is_bounded() -> None:
    sample = sample_accelerators(FakeNVML(init_error=FakeNVMLError("x" * 5000)))
    assert sample.reason is not None and len(sample.reason) < 300
