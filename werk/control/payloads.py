"""A stored state's payload on its way to and from a backend: the private copy a restore
consumes, a decode's way back to its disk copy, and an exported snapshot as catalog input."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio

from ..backends import BackendState, Runtime, StateKind
from ..protocol import CapabilityId, IncompatibleState, Unavailable
from .context import ServiceContext

__all__ = ["DiskCopy", "materialize", "owned_payload"]


def materialize(service: ServiceContext, principal: str, state_id: str) -> Path:
    """Copy the payload to a private file the backend may consume (move or read), its hash
    verified in the same pass; the host deletes it afterwards if it is still there."""
    scratch = service.config.home / "tmp"
    scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = scratch / f"restore-{secrets.token_hex(12)}.bin"
    service.catalog.export_payload(principal, state_id, target)
    return target


class DiskCopy:
    """A decode's way back to its state's disk copy (``DecodeCall.restore``): the payload is
    exported (hash-verified) only when the backend asks, counted as a restore, and whatever
    the backend left of it is deleted after the decode."""

    def __init__(
        self, service: ServiceContext, principal: str, state_id: str, runtime: Runtime
    ) -> None:
        self._service = service
        self._principal = principal
        self._state_id = state_id
        self._runtime = runtime
        self._path: Path | None = None

    async def payload(self) -> BackendState:
        if self._path is not None:
            raise IncompatibleState("a decode restores its state's disk copy at most once")
        service, principal, model = self._service, self._principal, self._runtime.model.id
        service.accounting.restore_attempted(principal, model)
        self._path = await anyio.to_thread.run_sync(
            lambda: materialize(service, principal, self._state_id)
        )
        await anyio.to_thread.run_sync(
            lambda: service.catalog.mark_loaded(principal, self._state_id)
        )
        return BackendState(
            kind=StateKind.FILE, path=self._path, generation=self._runtime.generation
        )

    def discard(self) -> None:
        if self._path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._path.unlink()


@contextlib.contextmanager
def owned_payload(exported: BackendState) -> Iterator[Any]:
    """The catalog input for an exported state; a FILE payload is deleted after the commit
    (the host owns it once ``werk_snapshot`` returns)."""
    if exported.kind is StateKind.BYTES and exported.data is not None:
        yield [exported.data]
        return
    if exported.kind is StateKind.FILE and exported.path is not None:
        try:
            yield exported.path
        finally:
            with contextlib.suppress(FileNotFoundError):
                exported.path.unlink()
        return
    raise Unavailable(
        "the backend's snapshot is not a bytes or file payload",
        capability=CapabilityId.STATE_PERSISTENCE,
    )
