"""werk-transformers: loaded through its real entry point; capability truth with no worker.

A Transformers text model has model residency but no state that outlives a generation:
residency is ``unavailable`` while no environment is found, ``supported`` with only ``load``
when one is found but no worker runs (a load starts one), and every state, prefill/decode and
expert row is ``unsupported`` (the seed's "Transformers compatibility" row).
"""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pytest

import werk
from werk import CapabilityContext, CapabilityReport

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


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No worker environment, whatever this machine has (a test that wants one says so)."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_TRANSFORMERS_PYTHON", raising=False)


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "transformers"]
    assert ep.dist is not None and ep.dist.name == "werk-transformers"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_transformers.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-transformers", _plugin())], environ={}
    )


def _rows() -> list[CapabilityReport]:
    rows = _pm().capabilities(CapabilityContext(backend="transformers"))
    assert all(r.backend == "transformers" and r.reason for r in rows)
    return rows


def test_registers_the_transformers_backend_for_chat_and_completions() -> None:
    pm = _pm()
    assert set(pm.backends) == {"transformers"}
    descriptor = pm.backends["transformers"]
    assert descriptor.routes == ("chat.completions", "completions")
    assert set(descriptor.formats) == {"hf", "transformers"}
    pm.check_pending()


def test_matrix_without_an_environment_names_the_install_command() -> None:
    rows = _rows()
    core = {r.id: r.status.value for r in rows if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert residency.reason == (
        "torch and Transformers are not installed; run `werk backends install transformers` "
        "(or `pip install werk-transformers[torch]`)"
    )


def test_with_an_environment_but_no_worker_a_load_starts_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    monkeypatch.setenv("WERK_TRANSFORMERS_PYTHON", str(python))
    [row] = [r for r in _rows() if r.id == "runtime.model_residency"]
    assert row.status.value == "supported" and row.operations == ["load"]
    assert row.reason.startswith("no transformers worker is running")
    assert "WERK_TRANSFORMERS_PYTHON" in row.reason and "/load" in row.reason


def test_the_torch_extra_is_the_managed_environment() -> None:
    """`pip install werk-transformers[torch]` and `werk backends install transformers` install
    the same."""
    from werk_transformers.environment import environment_spec

    project = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extra = tomllib.loads(project.read_text())["project"]["optional-dependencies"]["torch"]
    assert tuple(extra) == environment_spec().requirements
