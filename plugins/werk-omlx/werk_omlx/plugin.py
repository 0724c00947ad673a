"""Werk hook implementations for oMLX (Apple silicon, macOS only).

On other systems every operational row is ``unavailable`` (a prerequisite, macOS on Apple
silicon, is missing). The plugin implements no state or prefill/decode hook, so the host reports
those rows ``unsupported`` (backend contract 1.1).
"""

from __future__ import annotations

import platform
import shutil
from collections.abc import Callable

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    hookimpl,
)

BACKEND = "omlx"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND, formats=("mlx",), description="an installed oMLX CLI started on demand"
        )
    )


def _prerequisite() -> str:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return (
            f"oMLX needs macOS on Apple silicon; this is {platform.system()} {platform.machine()}"
        )
    if shutil.which("omlx") is None:
        return "no `omlx` executable on PATH"
    return "no active oMLX worker"


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    missing = _prerequisite()
    rows = [
        CapabilityReport(
            id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.UNAVAILABLE, reason=missing
        ),
        CapabilityReport(
            id=CapabilityId.EXPERTS_RESIDENCY,
            status=CapabilityStatus.UNAVAILABLE,
            reason=f"{missing}; needs a loaded worker with explicit expert offload",
        ),
    ]
    return rows
