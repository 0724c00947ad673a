"""Sampling host memory (psutil + cgroup budget) and accelerator memory (NVML via ``pynvml``).

Nothing is guessed: a failed host sample raises :class:`TelemetryError`; an accelerator sample
that could not be taken returns ``devices=None`` with a reason. A device field NVML cannot report
is ``None``, never 0. NVML is always shut down after a sample.

**Effective host budget.** With ``P_total``/``P_avail`` from ``psutil.virtual_memory()`` and the
cgroup budget of :func:`werk.memory.cgroup.read_cgroup_budget` (``L`` = minimum finite limit over
the process's cgroup and its ancestors, ``H`` = minimum over those levels of
``limit - (usage - reclaimable)``, reclaimable = clean file cache no process maps; both
infinite when no limit applies)::

    total_bytes     = min(P_total, L)
    available_bytes = min(P_avail, H, total_bytes)
    used_bytes      = total_bytes - available_bytes

so ``used + available == total`` always holds and a container limited below physical RAM
reports its limit, not the host's RAM.

**Unified memory** (one pool shared by CPU and accelerator) is declared only on positive
evidence, never inferred from a missing number:

* Apple silicon (``Darwin`` on ``arm64``), see :func:`is_apple_silicon`;
* an NVML sample whose every device is unified: NVML reports the ATS addressing mode (the GPU
  uses the host's page tables; GH200/GB200 class) through ``nvmlDeviceGetAddressingMode`` where
  the library has it, or the device name names a coherent CPU+GPU part (Grace, GH200, GB200,
  GB300, GB10, Jetson/Orin/Thor/Tegra).

A device whose ``nvmlDeviceGetMemoryInfo`` answers "not supported" (as on some unified parts)
keeps ``total_bytes``/``used_bytes`` as ``None``; that alone does not make it unified. Mixed
or uncertain systems are discrete: tiers stay apart, which never merges two budgets into one.
"""

from __future__ import annotations

import atexit
import contextlib
import platform
import re
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import msgspec
import psutil

from ..protocol.memory import AcceleratorMemory, HostMemory
from .cgroup import CgroupBudget, CgroupReadError, read_cgroup_budget

__all__ = [
    "AcceleratorSample",
    "HostBudget",
    "TelemetryError",
    "effective_host",
    "is_apple_silicon",
    "process_tree_rss",
    "sample_accelerators",
    "sample_host",
    "sample_host_budget",
]

_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ADDRESSING_MODE_ATS = 2
_UNIFIED_NAME = re.compile(
    r"\b(grace|gh200|gb200|gb300|gb10|jetson|orin|thor|tegra)\b", re.IGNORECASE
)


class TelemetryError(RuntimeError):
    """A telemetry source could not be sampled."""


class HostBudget(msgspec.Struct, frozen=True, kw_only=True):
    """A host sample and where its total came from.

    :ivar memory: the effective numbers (see the module docstring for the formula).
    :ivar physical_total_bytes: what psutil reports as physical RAM.
    :ivar source: ``physical``, or the cgroup version whose limit binds the total.
    :ivar cgroup: the cgroup budget read, if any limit applies.
    """

    memory: HostMemory
    physical_total_bytes: int
    source: Literal["physical", "cgroup v1", "cgroup v2"]
    cgroup: CgroupBudget | None = None


def effective_host(
    physical_total: int, physical_available: int, cgroup: CgroupBudget | None
) -> HostMemory:
    """Apply the documented formula to one psutil sample and one cgroup budget."""
    total = physical_total
    available = physical_available
    if cgroup is not None:
        total = min(total, cgroup.limit_bytes)
        available = min(available, cgroup.headroom_bytes)
    available = max(0, min(available, total))
    return HostMemory(total_bytes=total, used_bytes=total - available, available_bytes=available)


def sample_host_budget(
    *,
    virtual_memory: Callable[[], Any] = psutil.virtual_memory,
    cgroup: Callable[[], CgroupBudget | None] = read_cgroup_budget,
) -> HostBudget:
    """Sample psutil and the cgroup hierarchy and combine them.

    :param virtual_memory: psutil's sampler (tests inject a double).
    :param cgroup: the cgroup budget reader (tests inject one).
    :raises TelemetryError: when either source cannot be sampled.
    """
    try:
        vm = virtual_memory()
        physical_total = int(vm.total)
        physical_available = int(vm.available)
    except Exception as exc:  # psutil raises OSError subclasses and RuntimeError
        raise TelemetryError(f"host memory sampling failed: {type(exc).__name__}") from exc
    if physical_total <= 0 or physical_available < 0:
        raise TelemetryError("host memory sampling returned impossible numbers")
    try:
        budget = cgroup()
    except CgroupReadError as exc:
        raise TelemetryError(f"cgroup memory budget unreadable: {exc}") from exc
    memory = effective_host(physical_total, physical_available, budget)
    source: Literal["physical", "cgroup v1", "cgroup v2"] = "physical"
    if budget is not None and budget.limit_bytes < physical_total:
        source = "cgroup v2" if budget.version == 2 else "cgroup v1"
    return HostBudget(
        memory=memory, physical_total_bytes=physical_total, source=source, cgroup=budget
    )


def sample_host() -> HostMemory:
    """The effective host memory budget (psutil bounded by the process's cgroup limit).

    :raises TelemetryError: when psutil or a present cgroup control file cannot be sampled.
    """
    return sample_host_budget().memory


def is_apple_silicon(system: str | None = None, machine: str | None = None) -> bool:
    """Whether this is macOS on Apple silicon (one unified pool for CPU and GPU)."""
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    return system == "Darwin" and machine.lower() in ("arm64", "aarch64")


class AcceleratorSample(msgspec.Struct, frozen=True):
    """``devices`` is ``[]`` when NVML sampled and found none, ``None`` when it could not sample.

    :ivar reason: why ``devices`` is empty or ``None``.
    :ivar unified: every sampled device shares the host's memory pool (see module docstring).
    :ivar failed: NVML initialised but the sample then failed: a telemetry error, as opposed to
        NVML simply not being present on this machine.
    """

    devices: list[AcceleratorMemory] | None
    reason: str | None = None
    unified: bool = False
    failed: bool = False


NVML_LIBRARY = "libnvidia-ml.so.1"
"""The library pynvml loads on Linux (``pynvml._LoadNvmlLibrary``)."""


class NVMLLibraryMissing(Exception):
    """pynvml would fail to load NVML: raised before importing pynvml (about 30 ms) for nothing."""

    def __str__(self) -> str:
        return "NVML Shared Library Not Found"  # pynvml's own text for this case


def _load_nvml() -> ModuleType:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(NVML_LIBRARY)  # what pynvml's first nvmlInit does; cheap when absent
        except OSError:
            raise NVMLLibraryMissing from None
    import pynvml

    module: ModuleType = pynvml
    return module


_NVML_LOCK = threading.Lock()
_NVML_READY: dict[int, Any] = {}
"""NVML libraries initialised by this process (by ``id``; the value keeps the object alive)."""


def _nvml_ready(lib: Any) -> None:
    """``nvmlInit`` once per process and library; a failed init is tried again next time."""
    with _NVML_LOCK:
        if id(lib) not in _NVML_READY:
            lib.nvmlInit()
            _NVML_READY[id(lib)] = lib


def _nvml_forget(lib: Any) -> None:
    with _NVML_LOCK:
        if _NVML_READY.pop(id(lib), None) is not None:
            with contextlib.suppress(Exception):  # nothing left to free after a failure
                lib.nvmlShutdown()


@atexit.register
def shutdown_nvml() -> None:
    """Shut NVML down (at exit); the next sample initialises it again."""
    for lib in list(_NVML_READY.values()):
        _nvml_forget(lib)


def sample_accelerators(nvml: Any = None) -> AcceleratorSample:
    """Per-device memory from NVML, initialised once per process (not per sample).

    A failed sample shuts NVML down, so the next one starts afresh (a GPU that fell off the
    bus, a driver reload).

    :param nvml: an object with pynvml's API (tests inject a double); defaults to ``pynvml``.
    """
    try:
        lib = nvml if nvml is not None else _load_nvml()
    except ImportError as exc:
        return AcceleratorSample(None, f"pynvml is not importable: {exc}")
    except NVMLLibraryMissing as exc:
        return AcceleratorSample(None, f"NVML did not initialise: {_nvml_text(exc)}")
    try:
        _nvml_ready(lib)
    except Exception as exc:
        return AcceleratorSample(None, f"NVML did not initialise: {_nvml_text(exc)}")
    try:
        devices: list[AcceleratorMemory] = []
        unified_flags: list[bool] = []
        for index in range(int(lib.nvmlDeviceGetCount())):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            raw_name = lib.nvmlDeviceGetName(handle)
            name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
            total, used = _memory_info(lib, handle)
            devices.append(
                AcceleratorMemory(index=index, name=name, total_bytes=total, used_bytes=used)
            )
            unified_flags.append(_device_is_unified(lib, handle, name))
        unified = bool(unified_flags) and all(unified_flags)
        return AcceleratorSample(
            devices, None if devices else "NVML reports no devices", unified=unified
        )
    except Exception as exc:
        _nvml_forget(lib)
        return AcceleratorSample(None, f"NVML sampling failed: {_nvml_text(exc)}", failed=True)


def _memory_info(lib: Any, handle: Any) -> tuple[int | None, int | None]:
    """``(total, used)``; ``(None, None)`` when NVML says the query is not supported."""
    try:
        info = lib.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:
        if _is_not_supported(exc):
            return None, None
        raise
    return _non_negative(getattr(info, "total", None)), _non_negative(getattr(info, "used", None))


def _non_negative(value: Any) -> int | None:
    if value is None:
        return None
    number = int(value)
    if number < 0:
        raise ValueError("NVML reported a negative memory figure")
    return number


def _is_not_supported(exc: BaseException) -> bool:
    return (
        getattr(exc, "value", None) == _NVML_ERROR_NOT_SUPPORTED
        or type(exc).__name__ == "NVMLError_NotSupported"
    )


def _device_is_unified(lib: Any, handle: Any, name: str) -> bool:
    if _UNIFIED_NAME.search(name):
        return True
    query = getattr(lib, "nvmlDeviceGetAddressingMode", None)
    if query is None:
        return False
    try:
        mode = query(handle)
    except Exception:  # older drivers: the query is unknown, which is no evidence either way
        return False
    value = getattr(mode, "value", mode)
    return isinstance(value, int) and value == _NVML_ADDRESSING_MODE_ATS


def _nvml_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]


def process_tree_rss(pid: int) -> int | None:
    """Resident bytes of process ``pid`` and all its descendants now (``werk ps``); ``None``
    when it is gone or cannot be read. A page shared by two of them is counted twice."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except (psutil.Error, OSError):
        return None
    total = 0
    for process in tree:
        try:
            total += process.memory_info().rss
        except (psutil.Error, OSError):
            continue  # exited meanwhile: its memory is gone too
    return total
