"""MoE expert residency through the service: observe, plan, and apply bounded moves.

The engine (:class:`werk.experts.engine.ExpertEngine`, one per model) keeps the metadata; the
owning backend observes and moves experts through its hooks. Reading is allowed for an
``experimental`` capability; moving needs the explicit opt-in.
"""

from __future__ import annotations

from typing import Literal

from ..backends import ExpertMove, ExpertMoveOutcome, ExpertReport, Operation, Runtime
from ..experts.engine import ExpertEngine
from ..protocol import CapabilityId, ExpertActionRequest, ExpertActionResult, ExpertList
from .context import ServiceContext
from .gates import gate
from .runtimes import Use

__all__ = ["ExpertControl"]


class ExpertControl:
    """The expert routes of :class:`~werk.control.service.LocalControlService`."""

    def __init__(self, service: ServiceContext) -> None:
        self._service = service
        self._engines: dict[str, ExpertEngine] = {}

    async def _observed_engine(
        self, model: str, *, allow_experimental: bool
    ) -> tuple[Use, ExpertEngine]:
        """Gate ``runtime.experts.residency``, then refresh the model's engine from the
        backend's own observations (the engine never discovers experts itself). The runtime
        is held busy until the returned :class:`Use` is released."""
        service = self._service
        spec = service.spec(model)
        runtime = service.runtimes.live().get(model)
        gate(
            await service.rows_for(spec, runtime),
            CapabilityId.EXPERTS_RESIDENCY,
            allow_experimental=allow_experimental,
        )
        use = await service.runtimes.use(spec)
        try:
            report: ExpertReport = await service.pm.call_operation(
                Operation.OBSERVE_EXPERTS, use.runtime
            )
        except BaseException:
            use.release()
            raise
        engine = self._engines.setdefault(model, ExpertEngine(model))
        engine.observe(report.experts, complete=report.complete)
        for expert_id in report.accesses:
            engine.record_access(expert_id)
        return use, engine

    async def experts(self, model: str) -> ExpertList:
        # Reading observations changes nothing; an experimental capability may be inspected.
        use, engine = await self._observed_engine(model, allow_experimental=True)
        use.release()
        return engine.to_protocol()

    async def expert_action(
        self, model: str, action: Literal["prefetch", "evict"], request: ExpertActionRequest
    ) -> ExpertActionResult:
        """Plan (dry run, the default) or apply a bounded expert move. Both need the opt-in:
        the engine claims the experts before the adapter moves them and changes its metadata
        only for the experts the adapter reports moved."""
        use, engine = await self._observed_engine(
            model, allow_experimental=request.allow_experimental
        )
        with use:
            return await self._move_experts(engine, use.runtime, action, request)

    async def _move_experts(
        self,
        engine: ExpertEngine,
        runtime: Runtime,
        action: Literal["prefetch", "evict"],
        request: ExpertActionRequest,
    ) -> ExpertActionResult:
        if action == "prefetch":
            plan = engine.plan_prefetch(request.experts, target=request.target)
        else:
            plan = engine.plan_evict(request.experts, target=request.target)
        if request.dry_run or not plan.moves:
            return engine.result(plan, dry_run=request.dry_run)
        claim = engine.claim(plan.expert_ids, target=request.target)
        try:
            outcome: ExpertMoveOutcome = await self._service.pm.call_operation(
                Operation.MOVE_EXPERTS,
                runtime,
                move=ExpertMove(expert_ids=claim.expert_ids, target=request.target.value),
            )
        except BaseException:
            engine.abort(claim)
            raise
        completion = engine.complete(claim, outcome.moved)
        return engine.result(plan, dry_run=False, completion=completion)
