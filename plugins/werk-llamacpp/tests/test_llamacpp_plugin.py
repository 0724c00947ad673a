"""werk-llamacpp: loaded through its real entry point; capability truth before a state probe.

Expected rows are the seed's capability matrix column "llama.cpp before/after a failed state
probe": no live process has passed the functional probe on this machine, so every state and
prefill/decode row is ``unavailable``, RAM/VRAM tiers and experts are ``unsupported``.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pytest

import werk
from werk import CapabilityContext, CapabilityReport, ModelSpec

UNAVAILABLE, UNSUPPORTED = "unavailable", "unsupported"
FAILED_PROBE_COLUMN = {
    "runtime.model_residency": UNAVAILABLE,
    "runtime.state.prefix_cache": UNAVAILABLE,
    "runtime.state.persistence": UNAVAILABLE,
    "runtime.state.restore": UNAVAILABLE,
    "runtime.state.tier.disk": UNAVAILABLE,
    "runtime.state.restore.cross_restart": UNAVAILABLE,
    "runtime.state.restore.prefix": UNAVAILABLE,
    "runtime.state.tier.ram": UNSUPPORTED,
    "runtime.state.tier.vram": UNSUPPORTED,
    "runtime.pd.prefill": UNAVAILABLE,
    "runtime.pd.decode": UNAVAILABLE,
    "runtime.pd.handoff": UNAVAILABLE,
    "runtime.experts.residency": UNSUPPORTED,
}


@pytest.fixture
def no_llama_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where llama-server cannot be found anywhere."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.delenv("WERK_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("WERK_BUILD_CACHE", str(tmp_path / "no-cache"))


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\necho 'version: 0 (fake)'\n")
    path.chmod(0o755)
    return path


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "llamacpp"]
    assert ep.dist is not None and ep.dist.name == "werk-llamacpp"
    module = ep.load()
    assert isinstance(module, ModuleType) and module.__name__ == "werk_llamacpp.plugin"
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-llamacpp", _plugin())], environ={}
    )


def _rows(model: ModelSpec | None = None) -> list[CapabilityReport]:
    return _pm().capabilities(CapabilityContext(backend="llamacpp", model=model))


def _core(rows: list[CapabilityReport]) -> dict[str, str]:
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate capability ids"
    assert all(i.startswith(("runtime.", "llamacpp.")) for i in ids)
    return {r.id: r.status.value for r in rows if r.id.startswith("runtime.")}


def test_registers_the_llamacpp_backend() -> None:
    pm = _pm()
    assert set(pm.backends) == {"llamacpp"}
    assert pm.backends["llamacpp"].formats == ("gguf",)
    (row,) = pm.plugin_rows()
    assert row.status == "loaded" and row.backends == ["llamacpp"]
    pm.check_pending()


@pytest.mark.usefixtures("no_llama_server")
def test_matrix_without_an_executable() -> None:
    rows = _rows()
    assert _core(rows) == FAILED_PROBE_COLUMN
    assert all(r.reason and r.backend == "llamacpp" and r.model is None for r in rows)
    residency = next(r for r in rows if r.id == "runtime.model_residency")
    assert "llama-server" in (residency.reason or "")


def test_matrix_with_an_executable_and_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(_executable(tmp_path / "bin" / "llama-server")))
    model = ModelSpec(id="demo", backend="llamacpp", identity="sha256:" + "a" * 64)
    rows = _rows(model)
    # Finding the binary proves nothing about state support: still the failed-probe column.
    assert _core(rows) == FAILED_PROBE_COLUMN
    assert all(r.reason and r.model == "demo" for r in rows)


def test_gated_rows_name_their_operations() -> None:
    ops = {r.id: r.operations for r in _rows()}
    assert ops["runtime.pd.prefill"] == ["prefill"]
    assert ops["runtime.pd.decode"] == ["decode"]
    assert "restore" in ops["runtime.state.restore"]


# -- locating llama-server -------------------------------------------------------------------


def test_locate_honours_werk_llama_server(
    no_llama_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_llamacpp.executable import locate_llama_server

    exe = _executable(tmp_path / "custom" / "my-llama-server")
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(exe))
    located = locate_llama_server()
    assert located.path == exe.absolute()
    assert located.reason == "from WERK_LLAMA_SERVER"


def test_locate_explicit_path_wins_over_path(
    no_llama_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_llamacpp.executable import locate_llama_server

    on_path = _executable(tmp_path / "on-path" / "llama-server")
    explicit = _executable(tmp_path / "explicit" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(explicit))
    assert locate_llama_server().path == explicit.absolute()


@pytest.mark.parametrize("kind", ["not-executable", "missing", "directory"])
def test_locate_reports_a_bad_explicit_path(
    kind: str, no_llama_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_llamacpp.executable import locate_llama_server

    target = tmp_path / "llama-server"
    if kind == "not-executable":
        target.write_text("#!/bin/sh\n")
        target.chmod(0o644)
    elif kind == "directory":
        target.mkdir()
    # Even with a working llama-server on PATH, a wrong explicit setting is not silently ignored.
    on_path = _executable(tmp_path / "on-path" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(target))
    located = locate_llama_server()
    assert located.path is None
    assert located.reason == f"WERK_LLAMA_SERVER={target} is not an executable file"


def test_locate_finds_llama_server_on_path(
    no_llama_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_llamacpp.executable import locate_llama_server

    exe = _executable(tmp_path / "prepended" / "llama-server")
    monkeypatch.setenv("PATH", os.pathsep.join([str(exe.parent), os.environ["PATH"]]))
    located = locate_llama_server()
    assert located.path == exe.absolute()
    assert located.reason == "from PATH"


def test_locate_finds_the_build_cache(
    no_llama_server: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from werk_llamacpp.executable import locate_llama_server

    cache = tmp_path / "cache"
    _executable(cache / "llama-server" / "b1000" / "bin" / "llama-server")
    newest = _executable(cache / "llama-server" / "b2000" / "bin" / "llama-server")
    monkeypatch.setenv("WERK_BUILD_CACHE", str(cache))
    located = locate_llama_server()
    assert located.path == newest.absolute()
    assert located.reason == "from the werk build cache"


def test_locate_explains_where_to_look(no_llama_server: None) -> None:
    from werk_llamacpp.executable import locate_llama_server

    located = locate_llama_server()
    assert located.path is None
    assert "WERK_LLAMA_SERVER" in located.reason and "PATH" in located.reason
