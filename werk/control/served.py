"""Which models a server answers for: the ones named at start (``werk serve --model``), or every
model imported into its ``WERK_HOME``, read when used.

Without ``--model`` a model imported while the server runs is served at once, a re-imported one
is served as it is now (a changed identity starts a new runtime), and a removed one is no
longer served. A manifest is read again only when its file changed (one ``stat`` per lookup).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection, Sequence

from ..backends import ModelSpec
from ..models import ModelRegistry, validate_model_id
from ..protocol import InvalidRequest, NotFound

__all__ = ["ServedModels"]

log = logging.getLogger("werk.control")


class ServedModels:
    """The served models: ``fixed`` ones, or (``registry`` given) every imported one.

    :param prepare: what the server adds to a model's spec (its persistence defaults).
    :param backends: the backends a loaded plugin provides (a model of another is not served).
    """

    def __init__(
        self,
        fixed: Sequence[ModelSpec],
        *,
        registry: ModelRegistry | None,
        prepare: Callable[[ModelSpec], ModelSpec],
        backends: Collection[str],
    ) -> None:
        self._fixed = {spec.id: prepare(spec) for spec in fixed}
        self._registry = registry
        self._prepare = prepare
        self._backends = backends
        self._lock = threading.Lock()
        self._read: dict[str, tuple[tuple[int, int, int], ModelSpec]] = {}
        self._warned: set[str] = set()

    @property
    def imported(self) -> bool:
        """Whether every imported model is served (no ``--model``)."""
        return self._registry is not None

    def get(self, model: str) -> ModelSpec:
        """The spec of a served model.

        :raises werk.NotFound: not served (not named with ``--model``, not imported, or of a
            backend no plugin provides).
        """
        if self._registry is None:
            try:
                return self._fixed[model]
            except KeyError:
                raise NotFound(f"model {model!r} is not served here", param="model") from None
        spec = self._from_registry(self._registry, model)
        if spec is None:
            raise NotFound(
                f"model {model!r} is not imported here (see `werk models list`; "
                "`werk models import PATH --id ID` adds one)"
            )
        return spec

    def all(self) -> list[ModelSpec]:
        """Every served model, by id."""
        if self._registry is None:
            return list(self._fixed.values())
        specs = []
        for manifest in self._registry.manifests():
            spec = self._from_registry(self._registry, manifest.id)
            if spec is not None:
                specs.append(spec)
        return specs

    def _from_registry(self, registry: ModelRegistry, model: str) -> ModelSpec | None:
        try:
            info = os.stat(registry.root / f"{validate_model_id(model)}.json")
        except (OSError, InvalidRequest):
            return None
        key = (info.st_ino, info.st_mtime_ns, info.st_size)
        with self._lock:
            cached = self._read.get(model)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            spec = self._prepare(registry.get(model).spec())
        except (NotFound, InvalidRequest):
            return None
        if spec.backend not in self._backends:
            if model not in self._warned:
                self._warned.add(model)
                log.warning(
                    "model %s is not served: no installed plugin provides backend %r",
                    model,
                    spec.backend,
                )
            return None
        with self._lock:
            self._read[model] = (key, spec)
        return spec
