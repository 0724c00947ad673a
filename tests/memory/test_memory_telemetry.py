"""Telemetry: NVML double (discrete, unified, unsupported, failing), the host budget formula,
and the real host sample against psutil on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import psutil
import pytest

from werk.memory.cgroup import CgroupBudget, CgroupReadError
from werk.memory.telemetry import (
    TelemetryError,
    effective_host,
    is_apple_silicon,
    sample_accelerators,
    sample_host,
    sample_host_budget,
)

GiB = 1 << 30


class NotSupported(Exception):
    """Shaped like pynvml's NVMLError_NotSupported (``value`` 3)."""

    value = 3


@dataclass
class FakeDevice:
    name: str | bytes
    total: int | None = 80 * GiB
    used: int | None = 10 * GiB
    addressing: int | None = None  # None: the query is unknown to this driver


class FakeNVML:
    """A pynvml-shaped double. ``fail_at`` makes one call raise after init succeeded."""

    def __init__(
        self,
        devices: list[FakeDevice],
        *,
        addressing_api: bool = True,
        fail_at: str | None = None,
        init_error: Exception | None = None,
    ) -> None:
        self.devices = devices
        self.fail_at = fail_at
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        if addressing_api:
            self.nvmlDeviceGetAddressingMode = self._addressing

    def _maybe_fail(self, where: str) -> None:
        if self.fail_at == where:
            raise RuntimeError(f"NVML double failure in {where}")

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        self._maybe_fail("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice) -> SimpleNamespace:
        self._maybe_fail("memory")
        if handle.total is None:
            raise NotSupported("Not Supported")
        return SimpleNamespace(total=handle.total, used=handle.used, free=0)

    def _addressing(self, handle: FakeDevice) -> int:
        if handle.addressing is None:
            raise NotSupported("Not Supported")
        return handle.addressing


def test_discrete_devices() -> None:
    nvml = FakeNVML([FakeDevice(b"NVIDIA H100 80GB HBM3"), FakeDevice("NVIDIA L4", 24 * GiB, GiB)])
    sample = sample_accelerators(nvml)
    assert sample.devices is not None and not sample.unified and not sample.failed
    assert [(d.index, d.name, d.total_bytes, d.used_bytes) for d in sample.devices] == [
        (0, "NVIDIA H100 80GB HBM3", 80 * GiB, 10 * GiB),
        (1, "NVIDIA L4", 24 * GiB, GiB),
    ]
    assert (nvml.inits, nvml.shutdowns) == (1, 0)  # kept initialised for the next sample


def test_unified_by_name() -> None:
    sample = sample_accelerators(FakeNVML([FakeDevice("NVIDIA GH200 480GB")]))
    assert sample.unified and sample.devices is not None


def test_unified_by_ats_addressing_with_unsupported_memory_info() -> None:
    nvml = FakeNVML([FakeDevice("NVIDIA Example", total=None, used=None, addressing=2)])
    sample = sample_accelerators(nvml)
    assert sample.unified
    assert sample.devices is not None
    device = sample.devices[0]
    assert device.total_bytes is None and device.used_bytes is None  # null, never 0


def test_unsupported_memory_info_alone_is_not_unified() -> None:
    sample = sample_accelerators(FakeNVML([FakeDevice("NVIDIA Example", total=None, used=None)]))
    assert not sample.unified
    assert sample.devices is not None and sample.devices[0].total_bytes is None


def test_hmm_addressing_and_old_drivers_stay_discrete() -> None:
    assert not sample_accelerators(FakeNVML([FakeDevice("NVIDIA A100", addressing=1)])).unified
    assert not sample_accelerators(
        FakeNVML([FakeDevice("NVIDIA A100")], addressing_api=False)
    ).unified


def test_mixed_devices_stay_discrete() -> None:
    sample = sample_accelerators(FakeNVML([FakeDevice("NVIDIA GH200"), FakeDevice("NVIDIA L4")]))
    assert not sample.unified


def test_no_devices_is_an_empty_list() -> None:
    sample = sample_accelerators(FakeNVML([]))
    assert sample.devices == [] and sample.reason == "NVML reports no devices"
    assert not sample.failed and not sample.unified


def test_nvml_absent_is_not_a_failure() -> None:
    nvml = FakeNVML([], init_error=RuntimeError("NVML Shared Library Not Found"))
    sample = sample_accelerators(nvml)
    assert sample.devices is None and not sample.failed
    assert sample.reason is not None and "did not initialise" in sample.reason


@pytest.mark.parametrize("where", ["count", "memory"])
def test_failure_after_init_is_flagged_and_nvml_shut_down(where: str) -> None:
    nvml = FakeNVML([FakeDevice("NVIDIA L4")], fail_at=where)
    sample = sample_accelerators(nvml)
    assert sample.devices is None and sample.failed
    assert sample.reason is not None and where in sample.reason
    assert nvml.inits == nvml.shutdowns == 1


def test_apple_silicon_rule() -> None:
    assert is_apple_silicon("Darwin", "arm64")
    assert not is_apple_silicon("Darwin", "x86_64")
    assert not is_apple_silicon("Linux", "aarch64")


# -- host budget ---------------------------------------------------------------------------------


def _budget(limit: int, headroom: int) -> CgroupBudget:
    return CgroupBudget(
        version=2,
        path="/x",
        limit_bytes=limit,
        usage_bytes=limit - headroom,
        headroom_bytes=headroom,
    )


def test_effective_host_formula() -> None:
    # no cgroup: physical numbers
    h = effective_host(16 * GiB, 10 * GiB, None)
    assert (h.total_bytes, h.used_bytes, h.available_bytes) == (16 * GiB, 6 * GiB, 10 * GiB)
    # cgroup below RAM: its limit is the total; headroom bounds available
    h = effective_host(16 * GiB, 10 * GiB, _budget(4 * GiB, 3 * GiB))
    assert (h.total_bytes, h.used_bytes, h.available_bytes) == (4 * GiB, GiB, 3 * GiB)
    # host itself scarcer than the cgroup headroom
    h = effective_host(16 * GiB, GiB, _budget(4 * GiB, 3 * GiB))
    assert (h.total_bytes, h.used_bytes, h.available_bytes) == (4 * GiB, 3 * GiB, GiB)
    # a limit above RAM does not inflate the total
    h = effective_host(16 * GiB, 10 * GiB, _budget(64 * GiB, 60 * GiB))
    assert (h.total_bytes, h.available_bytes) == (16 * GiB, 10 * GiB)


def test_host_budget_sources_and_failures() -> None:
    vm = lambda: SimpleNamespace(total=16 * GiB, available=8 * GiB)  # noqa: E731
    detail = sample_host_budget(virtual_memory=vm, cgroup=lambda: _budget(2 * GiB, GiB))
    assert detail.source == "cgroup v2" and detail.memory.total_bytes == 2 * GiB
    assert detail.physical_total_bytes == 16 * GiB
    assert sample_host_budget(virtual_memory=vm, cgroup=lambda: None).source == "physical"

    def broken_cgroup() -> CgroupBudget:
        raise CgroupReadError("memory.max does not hold an integer")

    with pytest.raises(TelemetryError, match="cgroup"):
        sample_host_budget(virtual_memory=vm, cgroup=broken_cgroup)

    def broken_vm() -> SimpleNamespace:
        raise OSError("no /proc/meminfo")

    with pytest.raises(TelemetryError, match="OSError"):
        sample_host_budget(virtual_memory=broken_vm, cgroup=lambda: None)


def test_real_host_sample_matches_psutil() -> None:
    """On this machine (no cgroup memory limit below RAM) the sample is psutil's."""
    detail = sample_host_budget()
    before = psutil.virtual_memory()
    host = sample_host()
    after = psutil.virtual_memory()
    assert host.total_bytes + host.available_bytes > 0
    assert host.used_bytes + host.available_bytes == host.total_bytes
    if detail.source != "physical":
        pytest.skip(f"this process runs under a {detail.source} limit; see the cgroup tests")
    assert host.total_bytes == before.total
    low = min(before.available, after.available) - 64 * (1 << 20)
    high = max(before.available, after.available) + 64 * (1 << 20)
    assert low <= host.available_bytes <= high


def test_the_real_sample_imports_pynvml_only_where_nvml_can_load() -> None:
    """Without libnvidia-ml (this CI machine) the sample says so in pynvml's words and pynvml
    (about 30 ms to import) is never imported; with it, pynvml samples."""
    script = (
        "import ctypes, json, sys\n"
        "from werk.memory.telemetry import NVML_LIBRARY, sample_accelerators\n"
        "try:\n"
        "    ctypes.CDLL(NVML_LIBRARY)\n"
        "    present = True\n"
        "except OSError:\n"
        "    present = False\n"
        "sample = sample_accelerators()\n"
        "print(json.dumps([present, sample.reason, 'pynvml' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    present, reason, imported = json.loads(done.stdout)
    print(f"libnvidia-ml loadable: {present}; reason: {reason}; pynvml imported: {imported}")
    if present:
        assert imported
        assert reason is None or "Library Not Found" not in reason
    else:
        assert reason == "NVML did not initialise: NVML Shared Library Not Found"
        assert not imported
