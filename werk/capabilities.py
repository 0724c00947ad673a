"""Composing the capability matrix at call time.

Host-level rows (telemetry) come from the host itself; every other row comes from the plugin
that owns a backend, asked through :func:`werk.hookspecs.werk_capabilities`. Nothing is cached:
the matrix always reflects the plugins and runtimes present at the moment of the call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from .backends import CapabilityContext, ModelSpec, Runtime
from .memory.manager import reservations_capability
from .memory.telemetry import AcceleratorSample, TelemetryError, sample_accelerators, sample_host
from .plugins import WerkPluginManager
from .protocol.capabilities import CapabilityId, CapabilityReport, CapabilityStatus
from .protocol.errors import NotFound

__all__ = ["capability_contexts", "compose_capabilities", "host_capabilities"]


def host_capabilities(
    accelerators: Callable[[], AcceleratorSample] = sample_accelerators,
) -> list[CapabilityReport]:
    """The two host telemetry rows, from a real sample taken now."""
    rows: list[CapabilityReport] = []
    try:
        sample_host()
        rows.append(
            CapabilityReport(
                id=CapabilityId.MEMORY_TELEMETRY_HOST,
                status=CapabilityStatus.SUPPORTED,
                operations=["sample"],
            )
        )
    except TelemetryError as exc:
        rows.append(
            CapabilityReport(
                id=CapabilityId.MEMORY_TELEMETRY_HOST,
                status=CapabilityStatus.UNAVAILABLE,
                reason=str(exc),
            )
        )
    sample = accelerators()
    if sample.devices:
        rows.append(
            CapabilityReport(
                id=CapabilityId.MEMORY_TELEMETRY_ACCELERATOR,
                status=CapabilityStatus.SUPPORTED,
                operations=["sample"],
            )
        )
    else:
        rows.append(
            CapabilityReport(
                id=CapabilityId.MEMORY_TELEMETRY_ACCELERATOR,
                status=CapabilityStatus.UNAVAILABLE,
                reason=sample.reason or "no accelerator could be sampled",
            )
        )
    return rows


def capability_contexts(
    pm: WerkPluginManager,
    models: Sequence[ModelSpec] = (),
    runtimes: Mapping[str, Runtime] | None = None,
    *,
    model: str | None = None,
) -> list[CapabilityContext]:
    """What to ask the plugins: per backend either one context per model, or one backend-wide.

    :param models: configured models; a backend with none reports backend-wide rows.
    :param runtimes: live runtimes by model id (a snapshot: this reads it, never starts one).
    :param model: restrict to one model.
    :raises NotFound: ``model`` is not configured.
    """
    live = runtimes or {}
    if model is not None and not any(m.id == model for m in models):
        raise NotFound(f"model {model!r} is not configured")
    contexts: list[CapabilityContext] = []
    for backend in sorted(pm.backends):
        backend_models = [m for m in models if m.backend == backend]
        if model is not None:
            backend_models = [m for m in backend_models if m.id == model]
            if not backend_models:
                continue
        if not backend_models:
            contexts.append(CapabilityContext(backend=backend))
            continue
        contexts += [
            CapabilityContext(backend=backend, model=spec, runtime=live.get(spec.id))
            for spec in backend_models
        ]
    return contexts


def compose_capabilities(
    pm: WerkPluginManager,
    models: Sequence[ModelSpec] = (),
    runtimes: Mapping[str, Runtime] | None = None,
    *,
    model: str | None = None,
    accelerators: Callable[[], AcceleratorSample] = sample_accelerators,
    reservations: CapabilityReport | None = None,
) -> list[CapabilityReport]:
    """The full matrix, blocking (the local CLI): host rows, then every backend's rows.

    Arguments as :func:`capability_contexts`, plus:

    :param reservations: the memory manager's ``runtime.memory.reservations`` row; without a
        manager (the local CLI) no adapter participates, so the row is ``unavailable``.
    """
    contexts = capability_contexts(pm, models, runtimes, model=model)
    rows = host_capabilities(accelerators)
    rows.append(reservations if reservations is not None else reservations_capability(False))
    for context in contexts:
        rows.extend(pm.capabilities(context))
    return rows
