"""The in-process control service ``werk serve`` runs, for tests that drive a backend the way
the server does without HTTP (the conformance kit uses it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio

from ..backends import ModelSpec
from ..control.runtimes import DEFAULT_KEEP_ALIVE_SECONDS
from ..control.service import LocalControlService, ServiceConfig
from ..memory import MemoryManager
from ..plugins import WerkPluginManager, get_plugin_manager
from ..protocol import AuthMode
from ..state.principals import NamespaceKey

__all__ = ["local_service"]


@contextlib.asynccontextmanager
async def local_service(
    models: Sequence[ModelSpec],
    *,
    home: Path,
    pm: WerkPluginManager | None = None,
    keep_alive_seconds: float | None = DEFAULT_KEEP_ALIVE_SECONDS,
    preload: bool = False,
    memory: MemoryManager | None = None,
) -> AsyncIterator[LocalControlService]:
    """A control service serving ``models`` from ``home`` (unauthenticated local mode, a
    throw-away namespace key), closed afterwards: every runtime it started is stopped.

    :param pm: the plugin manager (default: a new one loading the ``werk`` entry points).
    :param keep_alive_seconds: how long an idle runtime stays loaded (``None``: forever); the
        idle unloader runs only where the caller starts ``service.run_idle_unloads``.
    :param preload: what ``werk serve --preload`` sets; the models start only where the
        caller awaits ``service.preload()``.
    :param memory: the memory manager (default: one that samples this machine).
    """
    service = LocalControlService(
        pm if pm is not None else get_plugin_manager(),
        ServiceConfig(
            home=home,
            models=list(models),
            auth_mode=AuthMode.UNAUTHENTICATED_LOCAL,
            namespace_key=NamespaceKey.ephemeral(),
            keep_alive_seconds=keep_alive_seconds,
            preload=preload,
        ),
        memory=memory,
    )
    try:
        yield service
    finally:
        with anyio.CancelScope(shield=True):
            await service.aclose()
