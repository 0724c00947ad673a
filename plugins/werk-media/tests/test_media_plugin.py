"""werk-media: loaded through its real entry point; capability truth with no media worker.

Media pipelines have model residency but no text KV state: residency is ``unavailable`` until a
worker runs, and every state, prefill/decode and expert row is ``unsupported``
(the seed's "other production backends" column; cross-restart restore is not advertised).
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from types import ModuleType

import werk
from werk import CapabilityContext, CapabilityReport, ModelSpec

UNAVAILABLE, UNSUPPORTED = "unavailable", "unsupported"
NO_WORKER_COLUMN = {
    "runtime.model_residency": UNAVAILABLE,
    "runtime.state.prefix_cache": UNSUPPORTED,
    "runtime.state.persistence": UNSUPPORTED,
    "runtime.state.restore": UNSUPPORTED,
    "runtime.state.tier.disk": UNSUPPORTED,
    "runtime.state.tier.ram": UNSUPPORTED,
    "runtime.state.tier.vram": UNSUPPORTED,
    "runtime.pd.prefill": UNSUPPORTED,
    "runtime.pd.decode": UNSUPPORTED,
    "runtime.pd.handoff": UNSUPPORTED,
    "runtime.experts.residency": UNSUPPORTED,
}


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "media"]
    assert ep.dist is not None and ep.dist.name == "werk-media"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_media.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-media", _plugin())], environ={}
    )


def _rows(model: ModelSpec | None = None) -> list[CapabilityReport]:
    rows = _pm().capabilities(CapabilityContext(backend="media", model=model))
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate capability ids"
    assert all(i.startswith(("runtime.", "media.")) for i in ids)
    assert all(r.backend == "media" and r.reason for r in rows)
    return rows


def test_registers_the_media_backend() -> None:
    pm = _pm()
    assert set(pm.backends) == {"media"}
    assert set(pm.backends["media"].formats) == {"diffusers", "transformers"}
    pm.check_pending()


def test_matrix_without_a_worker() -> None:
    core = {r.id: r.status.value for r in _rows() if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN


def test_per_model_rows_carry_the_model() -> None:
    model = ModelSpec(id="sdxl", backend="media", identity="sha256:" + "c" * 64)
    rows = _rows(model)
    assert {r.model for r in rows} == {"sdxl"}
    assert {r.id: r.status.value for r in rows if r.id.startswith("runtime.")} == NO_WORKER_COLUMN


def test_residency_reason_names_what_is_missing() -> None:
    residency = next(r for r in _rows() if r.id == "runtime.model_residency")
    missing = [m for m in ("torch", "diffusers", "transformers") if not importlib.util.find_spec(m)]
    for module in missing:
        assert module in (residency.reason or "")
    if not missing:
        assert "worker" in (residency.reason or "")


def test_cross_restart_restore_is_not_advertised() -> None:
    assert "runtime.state.restore.cross_restart" not in {r.id for r in _rows()}
