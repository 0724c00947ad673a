"""What a backend's hooks make possible: the host's side of backend contract 1.1.

A backend must provide :func:`~werk.hookspecs.werk_register_backends` (with ``start``/``stop``
when Werk should run it) and :func:`~werk.hookspecs.werk_openai` for ``/v1``. Every further hook
makes some core capability rows possible (:data:`HOOK_CAPABILITIES`). The host, not the plugin,
reports what a missing hook rules out:

* a core row the plugin does not report, whose hooks the plugin lacks, is added as
  ``unsupported`` with a reason naming the missing hook (:func:`complete_rows`);
* a row the plugin reports ``supported`` or ``experimental`` although a hook it needs is
  missing is lowered to ``unsupported`` — the host never reports more than the plugin can do.
  ``runtime.state.tier.ram`` has no hook of its own: the host keeps such states itself, so only
  a backend registered with ``states_in_process`` (its states are objects in ``werk serve``)
  and ``werk_prefill`` may claim it.

Rows the plugin does report for capabilities it can serve (``unavailable`` with a reason,
``externally_managed``, ``metadata_only``, …) are kept as they are: the plugin knows more.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .backends import Operation
from .protocol.capabilities import CapabilityId, CapabilityReport, CapabilityStatus

__all__ = ["HOOK_CAPABILITIES", "MINIMUM_HOOKS", "complete_rows", "required_hooks"]

MINIMUM_HOOKS: tuple[str, ...] = ("werk_register_backends", "werk_openai")
"""What every backend must implement (``werk_openai`` serves ``/v1``; without it inference
through Werk answers ``unsupported``)."""

HOOK_CAPABILITIES: dict[CapabilityId, tuple[Operation, ...]] = {
    CapabilityId.STATE_PREFIX_CACHE: (Operation.PREFILL,),
    CapabilityId.STATE_PERSISTENCE: (Operation.PREFILL, Operation.SNAPSHOT),
    CapabilityId.STATE_RESTORE: (Operation.RESTORE,),
    CapabilityId.STATE_TIER_DISK: (Operation.SNAPSHOT, Operation.RESTORE),
    CapabilityId.STATE_TIER_RAM: (),
    CapabilityId.STATE_TIER_VRAM: (),
    CapabilityId.PD_PREFILL: (Operation.PREFILL,),
    CapabilityId.PD_DECODE: (Operation.DECODE,),
    CapabilityId.PD_HANDOFF: (Operation.PREFILL, Operation.DECODE),
    CapabilityId.EXPERTS_RESIDENCY: (Operation.OBSERVE_EXPERTS, Operation.MOVE_EXPERTS),
}
"""The hooks each core capability needs. An empty tuple: no hook of this contract version can
provide it (RAM/VRAM state tiers have no Werk store yet), so it is always ``unsupported``
unless the plugin reports a weaker, more specific status."""

_NO_HOOK_REASON = "contract 1.1 has no hook that moves named states into this tier"
_CLAIMS = (CapabilityStatus.SUPPORTED, CapabilityStatus.EXPERIMENTAL)


def required_hooks(capability: str) -> tuple[Operation, ...] | None:
    """The hooks ``capability`` needs, or ``None`` when the host has no rule for it."""
    try:
        return HOOK_CAPABILITIES[CapabilityId(capability)]
    except (ValueError, KeyError):
        return None


def _missing(capability: CapabilityId, hooks: Iterable[str]) -> list[str]:
    present = set(hooks)
    return [op.value for op in HOOK_CAPABILITIES[capability] if op.value not in present]


def _why(capability: CapabilityId, missing: Sequence[str], backend: str) -> str:
    if not HOOK_CAPABILITIES[capability]:
        return _NO_HOOK_REASON
    return f"backend {backend!r} implements no {' or '.join(missing)} hook"


def complete_rows(
    rows: Sequence[CapabilityReport],
    *,
    hooks: Iterable[str],
    backend: str,
    model: str | None,
    can_start: bool,
    states_in_process: bool = False,
) -> list[CapabilityReport]:
    """The plugin's rows, corrected and completed from what its hooks make possible.

    :param rows: what the plugin reported (``backend``/``model`` already filled).
    :param hooks: the hook names the owning plugin implements.
    :param backend: the backend the rows are for.
    :param model: the model id, or ``None`` for backend-wide rows.
    :param can_start: whether the backend registered ``start``/``stop``.
    :param states_in_process: whether the backend registered ``states_in_process``.
    """
    hooks = list(hooks)
    ram_states = states_in_process and Operation.PREFILL.value in hooks
    out: list[CapabilityReport] = []
    reported: set[str] = set()
    for row in rows:
        reported.add(row.id)
        needed = required_hooks(row.id)
        if needed is None or row.status not in _CLAIMS:
            out.append(row)
            continue
        capability = CapabilityId(row.id)
        if capability is CapabilityId.STATE_TIER_RAM and ram_states:
            out.append(row)  # held in Werk's own volatile store
            continue
        missing = _missing(capability, hooks)
        if not needed or missing:
            out.append(
                CapabilityReport(
                    id=row.id,
                    status=CapabilityStatus.UNSUPPORTED,
                    backend=row.backend,
                    model=row.model,
                    reason=f"the plugin claimed {row.status}, but "
                    + _why(capability, missing, backend),
                )
            )
        else:
            out.append(row)
    for capability, needed in HOOK_CAPABILITIES.items():
        if capability.value in reported:
            continue
        missing = _missing(capability, hooks)
        if needed and not missing:
            continue  # the plugin can serve it and chose not to say: nothing to invent
        out.append(
            CapabilityReport(
                id=capability,
                status=CapabilityStatus.UNSUPPORTED,
                backend=backend,
                model=model,
                reason=_why(capability, missing, backend),
            )
        )
    if CapabilityId.MODEL_RESIDENCY.value not in reported and not can_start:
        out.append(
            CapabilityReport(
                id=CapabilityId.MODEL_RESIDENCY,
                status=CapabilityStatus.UNSUPPORTED,
                backend=backend,
                model=model,
                reason=f"backend {backend!r} registers no start/stop: Werk cannot load it",
            )
        )
    return out
