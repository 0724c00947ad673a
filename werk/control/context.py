"""What the service's helpers (:mod:`.prefill`, :mod:`.states`, :mod:`.experts`, :mod:`.jobs`,
:mod:`.openai`) need from it.

:class:`ServiceContext` is the narrow interface the helpers are given, so they depend on it and
not on :class:`~werk.control.service.LocalControlService` (which builds them): no import cycle.
:class:`ServiceConfig` is what ``werk serve`` decided at startup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import msgspec

from ..backends import ModelSpec, Runtime
from ..models import ModelManifest
from ..plugins import WerkPluginManager
from ..protocol import AuthMode, CapabilityReport, PersistenceDefaults
from ..state.catalog import StateCatalog
from ..state.envelope import Envelope
from ..state.handoffs import HandoffRegistry
from ..state.jobs import JobStore
from ..state.principals import NamespaceKey
from .accounting import ReuseAccounting
from .figures import Histogram
from .runtimes import DEFAULT_KEEP_ALIVE_SECONDS, RuntimeManager
from .volatile import VolatileStates

__all__ = ["ServiceConfig", "ServiceContext"]


class ServiceConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What ``werk serve`` decided at startup (models as manifests, or specs when embedded)."""

    home: Path
    models: Sequence[ModelManifest | ModelSpec]
    auth_mode: AuthMode
    namespace_key: NamespaceKey
    persistence_defaults: PersistenceDefaults | None = None
    keep_alive_seconds: float | None = DEFAULT_KEEP_ALIVE_SECONDS
    """How long a runtime stays loaded when idle (``werk serve --keep-alive``; None: forever)."""
    model_cache_release: bool = False
    """Release model files' page cache after unload (``WERK_MODEL_CACHE_RELEASE``)."""
    preload: bool = False
    """Start every configured model's runtime when the server starts (``werk serve``'s
    default; ``--no-preload`` turns it off) instead of on its first request."""
    serve_imported: bool = False
    """Serve every model imported into ``home`` (read when used) instead of ``models``:
    ``werk serve`` without ``--model``."""


class ServiceContext(Protocol):
    """The collaborators and helpers of the local control service."""

    pm: WerkPluginManager
    config: ServiceConfig
    clock: Callable[[], float]
    runtimes: RuntimeManager
    catalog: StateCatalog
    volatile: VolatileStates
    handoffs: HandoffRegistry
    accounting: ReuseAccounting
    commit_latency: Histogram
    restore_latency: Histogram
    job_store: JobStore

    def spec(self, model: str) -> ModelSpec: ...

    def served(self) -> list[ModelSpec]: ...

    async def rows_for(
        self, spec: ModelSpec, runtime: Runtime | None
    ) -> list[CapabilityReport]: ...

    def envelope_for(self, runtime: Runtime, principal: str) -> Envelope: ...

    def live_envelope(self, model: str, principal: str) -> Envelope | None: ...

    def forget_dead_generations(self) -> None: ...
