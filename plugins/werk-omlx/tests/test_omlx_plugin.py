"""werk-omlx: loaded through its real entry point; capability truth without a running worker.

No ``omlx`` executable: residency and expert residency are ``unavailable`` (the reason names
what is missing, the platform included off macOS). An executable but no runtime: residency
``unavailable`` (the first request starts one), expert residency ``unsupported`` (the adapter is
decided per model when its runtime starts; ``test_omlx_experts.py`` proves the other cells).
Every named-state and prefill/decode row is ``unsupported``; the seed's "other production
backends" column, which does not advertise ``runtime.state.restore.cross_restart``. Running
and after-crash rows are proven through ``werk serve`` in ``test_omlx_serve.py``.
"""

from __future__ import annotations

import platform
from importlib.metadata import entry_points
from pathlib import Path
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
    assert pm.backends["omlx"].start is not None
    assert pm.backends["omlx"].routes == ("chat.completions", "completions")
    pm.check_pending()


@pytest.fixture
def no_omlx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("WERK_OMLX_BIN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no omlx anywhere


def test_matrix_without_an_executable(no_omlx: None) -> None:
    core = {r.id: r.status.value for r in _rows() if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN
    reason = next(r for r in _rows() if r.id == "runtime.model_residency").reason or ""
    assert "no `omlx` executable (WERK_OMLX_BIN unset, none on PATH)" in reason


def test_matrix_with_an_executable_before_any_worker_starts(
    monkeypatch: pytest.MonkeyPatch, omlx_bin: Path
) -> None:
    monkeypatch.setenv("WERK_OMLX_BIN", str(omlx_bin))
    rows = {r.id: r for r in _rows()}
    core = {i: r.status.value for i, r in rows.items() if i.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN | {"runtime.experts.residency": UNSUPPORTED}
    assert rows["runtime.model_residency"].reason == (
        "no oMLX worker is running; the first request for the model starts one"
    )
    assert "decided per model when its runtime starts" in (
        rows["runtime.experts.residency"].reason or ""
    )


def test_a_configured_path_that_is_not_executable_is_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WERK_OMLX_BIN", str(tmp_path / "missing"))
    reason = next(r for r in _rows() if r.id == "runtime.model_residency").reason
    assert reason == f"WERK_OMLX_BIN={tmp_path / 'missing'} is not an executable"


@pytest.mark.skipif(APPLE_SILICON, reason="explains a missing platform prerequisite")
def test_reason_names_the_missing_platform(no_omlx: None) -> None:
    rows = {r.id: r for r in _rows()}
    for cap in ("runtime.model_residency", "runtime.experts.residency"):
        reason = rows[cap].reason or ""
        assert "macOS on Apple silicon" in reason
        assert platform.system() in reason


def test_cross_restart_restore_is_not_advertised() -> None:
    assert "runtime.state.restore.cross_restart" not in {r.id for r in _rows()}
