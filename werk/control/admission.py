"""Memory admission of a runtime start: the backend's requirement, and its reservation.

A backend that gives a :class:`werk.RuntimeRequirement` for a model has its bytes reserved with
the :class:`werk.memory.MemoryManager` before the start (see :mod:`.runtimes`, "Admission").
These are the steps that need no runtime table: asking the backend (checked, logged), reserving
(with the model's needs in the error), and listing the models whose start would go unreserved.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from .._units import format_bytes
from ..backends import BackendDescriptor, ModelSpec, RuntimeRequirement
from ..memory.manager import MemoryManager, Reservation
from ..plugins import WerkPluginManager
from ..protocol import CapabilityId, InvalidRequest, ResourceExhausted, Unavailable, WerkError

__all__ = ["requirement", "reserve", "unbounded"]

log = logging.getLogger("werk.runtimes")


async def requirement(descriptor: BackendDescriptor, spec: ModelSpec) -> RuntimeRequirement | None:
    """The backend's requirement for ``spec`` (``None``: it gives no bound, or no function).

    :raises werk.Unavailable: the backend's function failed or answered something else.
    """
    if descriptor.requirement is None:
        return None
    try:
        answer = await descriptor.runtime_requirement(spec)
    except WerkError:
        raise
    except Exception as exc:
        log.exception("the %s requirement of model %s failed", spec.backend, spec.id)
        raise Unavailable(
            f"backend {spec.backend!r} could not compute the memory model {spec.id!r} needs "
            f"({type(exc).__name__})",
            capability=CapabilityId.MEMORY_RESERVATIONS,
        ) from None
    if answer is not None and not isinstance(answer, RuntimeRequirement):
        raise Unavailable(
            f"backend {spec.backend!r} answered its requirement with a "
            f"{type(answer).__name__}, not a RuntimeRequirement",
            capability=CapabilityId.MEMORY_RESERVATIONS,
        )
    if answer is None:
        log.info("model %s starts without a memory reservation (no bound given)", spec.id)
    return answer


def reserve(
    memory: MemoryManager,
    owner: str,
    spec: ModelSpec,
    needed: RuntimeRequirement,
    relieve: bool = True,
) -> Reservation:
    """Reserve ``needed`` for ``owner`` (in a worker thread: relief callbacks come back to the
    event loop); a refusal names what the model needs."""
    parts = " + ".join(f"{name} {format_bytes(n)}" for name, n in needed.parts)
    needs = f"model {spec.id!r} needs {format_bytes(needed.nbytes)}" + (
        f" ({parts})" if parts else ""
    )
    try:
        return memory.reserve(owner, needed.nbytes, tier=needed.tier, relieve=relieve)
    except ResourceExhausted as exc:
        raise ResourceExhausted(
            f"cannot load: {needs}; {exc.message}", capability=exc.capability
        ) from None
    except InvalidRequest as exc:  # larger than the whole pool: it can never fit
        raise InvalidRequest(
            f"cannot load: {needs}; {exc.message}", capability=exc.capability
        ) from None


async def unbounded(
    pm: WerkPluginManager, specs: Collection[ModelSpec], memory: MemoryManager | None
) -> dict[str, str]:
    """The models among ``specs`` whose start would not be reserved, with why (for the
    ``runtime.memory.reservations`` row). Each backend's requirement is computed now, as a
    start would (for llama.cpp: the cached inspection and the GGUF header)."""
    out: dict[str, str] = {}
    for spec in specs:
        descriptor = pm.backends.get(spec.backend)
        if descriptor is None or descriptor.start is None:
            continue  # Werk does not start it: nothing of it to account here
        if descriptor.requirement is None or memory is None:
            out[spec.id] = f"backend {spec.backend!r} gives no memory requirement"
            continue
        try:
            answer = await descriptor.runtime_requirement(spec)
        except WerkError as exc:
            out[spec.id] = f"its requirement cannot be computed ({exc.message})"
            continue
        except Exception as exc:
            out[spec.id] = f"its requirement cannot be computed ({type(exc).__name__})"
            continue
        if answer is None:
            out[spec.id] = f"backend {spec.backend!r} gives no bound for it (see its log)"
    return out
