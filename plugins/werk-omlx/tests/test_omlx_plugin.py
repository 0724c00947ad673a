"""werk-omlx: loaded through its real entry point; capability truth on this machine.

oMLX needs macOS on Apple silicon and a loaded worker. Without an active worker, residency and
expert residency are ``unavailable`` (a prerequisite is missing) and every named-state and
prefill/decode row is ``unsupported`` (oMLX has no such contract); the seed's "other production
backends" column, which does not advertise ``runtime.state.restore.cross_restart``.
"""

from __future__ import annotations

import platform
from importlib.metadata import entry_points
from types import ModuleType

import pytest

import werk
from werk import CapabilityContext, CapabilityReport

UNAVAILABLE, UNSUPPORTED = "unavailable", "unsupported"
NO_WORKER_COLUMN = {
    "runtime.model_residency": UNAVAILABLE,
    "runtime.experts.residency": UNAVAILABLE,
    "runtime.state.prefix_cache": UNSUPPORTED,
    "runtime.state.persistence": UNSUPPORTED,
    "runtime.state.restore": UNSUPPORTED,
    "runtime.state.tier.disk": UNSUPPORTED,
    "runtime.state.tier.ram": UNSUPPORTED,
    "runtime.state.tier.vram": UNSUPPORTED,
    "runtime.pd.prefill": UNSUPPORTED,
    "runtime.pd.decode": UNSUPPORTED,
    "runtime.pd.handoff": UNSUPPORTED,
}
APPLE_SILICON = platform.system() == "Darwin" and platform.machine() == "arm64"


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "omlx"]
    assert ep.dist is not None and ep.dist.name == "werk-omlx"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_omlx.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-omlx", _plugin())], environ={}
    )


def _rows() -> list[CapabilityReport]:
    rows = _pm().capabilities(CapabilityContext(backend="omlx"))
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate capability ids"
    assert all(i.startswith(("runtime.", "omlx.")) for i in ids)
    assert all(r.backend == "omlx" and r.reason for r in rows)
    return rows


def test_registers_the_omlx_backend() -> None:
    pm = _pm()
    assert set(pm.backends) == {"omlx"}
    assert pm.backends["omlx"].formats == ("mlx",)
    pm.check_pending()


def test_matrix_without_an_active_worker() -> None:
    core = {r.id: r.status.value for r in _rows() if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN


@pytest.mark.skipif(APPLE_SILICON, reason="explains a missing platform prerequisite")
def test_reason_names_the_missing_platform() -> None:
    rows = {r.id: r for r in _rows()}
    for cap in ("runtime.model_residency", "runtime.experts.residency"):
        reason = rows[cap].reason or ""
        assert "macOS on Apple silicon" in reason
        assert platform.system() in reason


def test_cross_restart_restore_is_not_advertised() -> None:
    assert "runtime.state.restore.cross_restart" not in {r.id for r in _rows()}
