"""Werk hook implementations for the Diffusers/Transformers media worker.

Media pipelines have model residency but no text KV state. Residency is ``unavailable`` until
the worker's Python libraries are installed and a worker can be started; the plugin implements
no state, prefill/decode or expert hook, so the host reports those rows ``unsupported``
(backend contract 1.1).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    hookimpl,
)

BACKEND = "media"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("diffusers", "transformers"),
            description="a resident Diffusers/Transformers media worker",
        )
    )


def _residency_reason() -> str:
    missing = [
        m for m in ("torch", "diffusers", "transformers") if importlib.util.find_spec(m) is None
    ]
    if missing:
        return f"the media worker needs {', '.join(missing)} installed"
    return "no media worker has been started"


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    rows = [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY,
            status=CapabilityStatus.UNAVAILABLE,
            reason=_residency_reason(),
        ),
    ]
    return rows
