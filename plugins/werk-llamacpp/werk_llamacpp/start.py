"""``BackendDescriptor.start`` of the llama.cpp backend (named as a string, imported on the
first start, so that loading the plugin imports no process code).

The executable's re-hash for the check after readiness begins here when its inspection is
already cached (the requirement computed just before inspected it), before the process layer is
imported (~15 ms): it then runs on another core while the start prepares, not next to the
loading child (where it delayed the tiny demo's readiness by ~15 ms).
"""

from __future__ import annotations

from werk import ModelSpec, Runtime

from .executable import locate_llama_server
from .inspect import cached_inspection, start_rehash

__all__ = ["start_runtime"]


async def start_runtime(spec: ModelSpec) -> Runtime:
    """Start one llama-server child for ``spec`` (see the module docstring)."""
    located = locate_llama_server(spec.options)
    inspection = cached_inspection(located.path) if located.path is not None else None
    early = (inspection, start_rehash(inspection)) if inspection is not None else None

    from .process import start_runtime as start_process

    return await start_process(spec, rehash=early)
