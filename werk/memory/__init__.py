"""Memory telemetry and accounting (host and accelerator)."""

from .telemetry import AcceleratorSample, TelemetryError, sample_accelerators, sample_host

__all__ = ["AcceleratorSample", "TelemetryError", "sample_accelerators", "sample_host"]
