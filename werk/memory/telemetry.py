"""Sampling host memory (psutil) and accelerator memory (NVML via ``pynvml``).

Nothing is guessed: a failed sample raises :class:`TelemetryError` (host) or returns
``devices=None`` with a reason (accelerators). NVML is always shut down after a sample.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from ..protocol.memory import AcceleratorMemory, HostMemory

__all__ = ["AcceleratorSample", "TelemetryError", "sample_accelerators", "sample_host"]


class TelemetryError(RuntimeError):
    """A telemetry source could not be sampled."""


def sample_host() -> HostMemory:
    """Physical host memory as psutil reports it.

    :raises TelemetryError: when psutil cannot sample.
    """
    try:
        vm = psutil.virtual_memory()
    except Exception as exc:  # psutil raises OSError subclasses and RuntimeError
        raise TelemetryError(f"host memory sampling failed: {type(exc).__name__}") from exc
    return HostMemory(
        total_bytes=int(vm.total),
        used_bytes=int(vm.total - vm.available),
        available_bytes=int(vm.available),
    )


@dataclass(frozen=True)
class AcceleratorSample:
    """``devices`` is ``[]`` when NVML sampled and found none, ``None`` when it could not sample."""

    devices: list[AcceleratorMemory] | None
    reason: str | None = None


def _load_nvml() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def sample_accelerators(nvml: Any = None) -> AcceleratorSample:
    """Per-device memory from NVML.

    :param nvml: an object with pynvml's API (tests inject a double); defaults to ``pynvml``.
    """
    try:
        lib = nvml if nvml is not None else _load_nvml()
    except ImportError as exc:
        return AcceleratorSample(None, f"pynvml is not importable: {exc}")
    try:
        lib.nvmlInit()
    except Exception as exc:
        return AcceleratorSample(None, f"NVML did not initialise: {_nvml_text(exc)}")
    try:
        devices = []
        for index in range(int(lib.nvmlDeviceGetCount())):
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            name = lib.nvmlDeviceGetName(handle)
            info = lib.nvmlDeviceGetMemoryInfo(handle)
            devices.append(
                AcceleratorMemory(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    total_bytes=int(info.total),
                    used_bytes=int(info.used),
                )
            )
        return AcceleratorSample(devices, None if devices else "NVML reports no devices")
    except Exception as exc:
        return AcceleratorSample(None, f"NVML sampling failed: {_nvml_text(exc)}")
    finally:
        # A shutdown failure after a failed sample has nothing left to free.
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def _nvml_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text[:200]
