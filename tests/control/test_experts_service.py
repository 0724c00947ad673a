"""The expert routes' service logic with an in-process MoE stand-in plugin.

No production adapter on this machine observes MoE experts (oMLX needs macOS), so a small
plugin stands in for one: it reports experts through ``werk_observe_experts`` and moves them
through ``werk_move_experts``, failing on request, so the host's gate → observe → plan → claim →
move → complete flow is exercised for real.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from pathlib import Path

import pytest

import werk
from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ExpertMove,
    ExpertMoveOutcome,
    ExpertObservation,
    ExpertReport,
    ModelSpec,
    Runtime,
    hookimpl,
)
from werk.control.service import LocalControlService, ServiceConfig
from werk.models import ModelRegistry
from werk.protocol import AuthMode, ExpertActionRequest, ExpertTier
from werk.state.principals import NamespaceKey


class MoEStandIn:
    """Stands in for an adapter with truthful expert observations and a move operation."""

    def __init__(self) -> None:
        self.tiers = {"e0": ExpertTier.VRAM, "e1": ExpertTier.RAM, "e2": ExpertTier.EXTERNAL}
        self.sizes: dict[str, int | None] = {"e0": 100, "e1": 100, "e2": None}
        self.refuse: set[str] = set()
        self.explode = False
        self.moves: list[ExpertMove] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        async def start(model: ModelSpec) -> Runtime:
            return Runtime(backend="moe", model=model, generation="g_" + secrets.token_hex(4))

        async def stop(runtime: Runtime) -> None:
            runtime.alive = False

        register(BackendDescriptor(name="moe", formats=("moe",), start=start, stop=stop))

    @hookimpl
    def werk_capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        return [
            CapabilityReport(
                id=CapabilityId.EXPERTS_RESIDENCY,
                status=CapabilityStatus.EXPERIMENTAL,
                reason="stand-in adapter with explicit expert offload",
            )
        ]

    @hookimpl
    def werk_observe_experts(self, runtime: Runtime) -> ExpertReport:
        return ExpertReport(
            experts=[
                ExpertObservation(id=k, tier=v, nbytes=self.sizes[k]) for k, v in self.tiers.items()
            ],
            accesses=["e2", "e2", "e1"],
        )

    @hookimpl
    async def werk_move_experts(self, runtime: Runtime, move: ExpertMove) -> ExpertMoveOutcome:
        self.moves.append(move)
        if self.explode:
            raise RuntimeError("adapter exploded")
        moved = [e for e in move.expert_ids if e not in self.refuse]
        for expert in moved:
            self.tiers[expert] = ExpertTier(move.target)
        return ExpertMoveOutcome(
            moved=moved, failed=[e for e in move.expert_ids if e in self.refuse]
        )


@pytest.fixture
def service(tmp_path: Path) -> tuple[LocalControlService, MoEStandIn]:
    plugin = MoEStandIn()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("moe-stand-in", plugin)])
    weights = tmp_path / "m.moe"
    weights.write_bytes(b"moe")
    manifest = ModelRegistry(tmp_path).import_files([weights], model_id="m", backend="moe")
    config = ServiceConfig(
        home=tmp_path,
        models=[manifest],
        auth_mode=AuthMode.UNAUTHENTICATED_LOCAL,
        namespace_key=NamespaceKey.ephemeral(),
    )
    return LocalControlService(pm, config), plugin


@pytest.mark.anyio
async def test_observed_experts_are_listed_with_hotness(
    service: tuple[LocalControlService, MoEStandIn],
) -> None:
    control, _ = service
    listing = await control.experts("local", "m")
    by_id = {e.id: e for e in listing.experts}
    assert set(by_id) == {"e0", "e1", "e2"}
    assert by_id["e2"].bytes is None  # unknown stays unknown
    assert by_id["e2"].hotness > by_id["e1"].hotness > by_id["e0"].hotness == 0


@pytest.mark.anyio
async def test_action_needs_opt_in_and_dry_run_moves_nothing(
    service: tuple[LocalControlService, MoEStandIn],
) -> None:
    control, plugin = service
    with pytest.raises(werk.ExperimentalOptInRequired) as info:
        await control.expert_action("local", "m", "prefetch", ExpertActionRequest(experts=["e2"]))
    assert info.value.capability == "runtime.experts.residency"
    preview = await control.expert_action(
        "local",
        "m",
        "prefetch",
        ExpertActionRequest(experts=["e2"], target=ExpertTier.RAM, allow_experimental=True),
    )
    assert preview.dry_run and [(a.id, a.from_, a.to) for a in preview.planned] == [
        ("e2", ExpertTier.EXTERNAL, ExpertTier.RAM)
    ]
    assert preview.applied == [] and plugin.moves == []


@pytest.mark.anyio
async def test_apply_changes_metadata_only_for_reported_moves(
    service: tuple[LocalControlService, MoEStandIn],
) -> None:
    control, plugin = service
    plugin.refuse = {"e1"}
    result = await control.expert_action(
        "local",
        "m",
        "evict",
        ExpertActionRequest(
            experts=["e0", "e1"], target=ExpertTier.EXTERNAL, dry_run=False, allow_experimental=True
        ),
    )
    assert [a.id for a in result.applied] == ["e0"]
    assert any(s.id == "e1" for s in result.skipped)
    assert [m.expert_ids for m in plugin.moves] == [("e0", "e1")]
    listing = {e.id: e.tier for e in (await control.experts("local", "m")).experts}
    assert listing["e0"] is ExpertTier.EXTERNAL and listing["e1"] is ExpertTier.RAM


@pytest.mark.anyio
async def test_a_failing_move_releases_the_claim(
    service: tuple[LocalControlService, MoEStandIn],
) -> None:
    control, plugin = service
    plugin.explode = True
    request = ExpertActionRequest(
        experts=["e2"], target=ExpertTier.RAM, dry_run=False, allow_experimental=True
    )
    with pytest.raises(werk.BackendError):
        await control.expert_action("local", "m", "prefetch", request)
    # the claim was aborted: the same experts can be planned and claimed again
    preview = await control.expert_action(
        "local",
        "m",
        "prefetch",
        ExpertActionRequest(experts=["e2"], target=ExpertTier.RAM, allow_experimental=True),
    )
    assert [a.id for a in preview.planned] == ["e2"]
    plugin.explode = False
    applied = await control.expert_action("local", "m", "prefetch", request)
    assert [a.id for a in applied.applied] == ["e2"]
    listing = {e.id: e.tier for e in (await control.experts("local", "m")).experts}
    assert listing["e2"] is ExpertTier.RAM
