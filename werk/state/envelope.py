"""The compatibility envelope: an immutable record of everything that produced a state.

Reuse requires exact equality of the *complete* envelope. There are no wildcard dimensions: a
changed backend binary, model, runtime argument, cache layout, process generation or principal
makes a state incompatible. Incompatibility (:class:`werk.IncompatibleState`) is distinct from a
miss (no state at all).

One relaxation, never a wildcard: a **disk** state from an earlier process generation whose
envelope is equal in every other dimension is compatible with a runtime that *proved* it can
restore such states (``runtime.state.restore.cross_restart`` ``experimental`` for that very
generation; see :meth:`Envelope.compatible_with`). Volatile states and handoffs stay bound to
their generation: they die with it.
"""

from __future__ import annotations

import hashlib

import msgspec

__all__ = ["Envelope"]


class Envelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Who and what produced a state.

    :ivar adapter: plugin distribution name (``werk-llamacpp``).
    :ivar adapter_version: that plugin's version.
    :ivar backend: backend name (``llamacpp``).
    :ivar executable: fingerprint of the backend executable (``sha256:…``), or ``""`` when the
        backend has none (in-process).
    :ivar model_identity: the model manifest identity (``sha256:…``).
    :ivar runtime_args: the effective runtime arguments, in order.
    :ivar cache_layout: the backend's description of its state layout (opaque to the host).
    :ivar generation: the process generation that produced the state.
    :ivar principal: the owning principal (``p_…`` or ``local``).
    """

    adapter: str
    adapter_version: str
    backend: str
    executable: str
    model_identity: str
    runtime_args: tuple[str, ...]
    cache_layout: str
    generation: str
    principal: str

    def digest(self) -> str:
        """A stable ``sha256:`` digest over the canonical JSON of every field."""
        canonical = msgspec.json.encode(msgspec.structs.asdict(self), order="sorted")
        return "sha256:" + hashlib.sha256(canonical).hexdigest()

    def compatible_with(self, other: Envelope, *, across_generations: bool = False) -> bool:
        """Exact equality of every dimension; with ``across_generations`` (a disk state and a
        runtime whose cross-restart restore is proven) every dimension but the generation."""
        if across_generations:
            return msgspec.structs.replace(self, generation="") == msgspec.structs.replace(
                other, generation=""
            )
        return self == other

    def differences(self, other: Envelope) -> list[str]:
        """The names of the dimensions in which ``other`` differs (for messages)."""
        return [
            name for name in self.__struct_fields__ if getattr(self, name) != getattr(other, name)
        ]
