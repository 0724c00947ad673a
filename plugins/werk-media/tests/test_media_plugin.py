"""werk-media: loaded through its real entry point; capability truth with no media worker.

Media pipelines have model residency but no text KV state: residency is ``unavailable`` while no
worker environment is found, ``supported`` with only ``load`` when one is found but no worker
runs (a load starts one), and every state, prefill/decode and expert row is ``unsupported``
(the seed's "other production backends" column; cross-restart restore is not advertised).
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pytest

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


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No media environment, whatever this machine has (the real locators find none; a test
    that wants one says so)."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_MEDIA_PYTHON", raising=False)
    monkeypatch.delenv("WERK_QWEN_TTS_PYTHON", raising=False)


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


def _rows(model: ModelSpec | None = None, backend: str = "media") -> list[CapabilityReport]:
    rows = _pm().capabilities(CapabilityContext(backend=backend, model=model))
    ids = [r.id for r in rows]
    assert len(ids) == len(set(ids)), "duplicate capability ids"
    assert all(i.startswith(("runtime.", "media.")) for i in ids)
    assert all(r.backend == backend and r.reason for r in rows)
    return rows


def test_registers_the_media_and_qwen_tts_backends() -> None:
    pm = _pm()
    assert set(pm.backends) == {"media", "qwen-tts"}
    assert set(pm.backends["media"].formats) == {"diffusers", "transformers"}
    assert pm.backends["qwen-tts"].formats == ("qwen3-tts",)
    assert pm.backends["qwen-tts"].routes == ("audio.speech",)
    pm.check_pending()


@pytest.mark.parametrize("backend", ["media", "qwen-tts"])
def test_matrix_without_a_worker(backend: str) -> None:
    core = {r.id: r.status.value for r in _rows(backend=backend) if r.id.startswith("runtime.")}
    assert core == NO_WORKER_COLUMN


@pytest.mark.parametrize("backend", ["media", "qwen-tts"])
def test_with_an_environment_but_no_worker_a_load_starts_one(
    backend: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from werk_media.environment import MediaPython

    found = MediaPython(python=tmp_path / "python", source="WERK_BACKENDS_DIR (test)")
    monkeypatch.setattr(_plugin(), "LOCATORS", {"media": lambda: found, "qwen-tts": lambda: found})
    [row] = [r for r in _rows(backend=backend) if r.id == "runtime.model_residency"]
    assert row.status.value == "supported" and row.operations == ["load"]
    assert row.reason.startswith(f"no {backend} worker is running")
    assert "WERK_BACKENDS_DIR (test)" in row.reason and "/load" in row.reason


def test_per_model_rows_carry_the_model() -> None:
    model = ModelSpec(id="sdxl", backend="media", identity="sha256:" + "c" * 64)
    rows = _rows(model)
    assert {r.model for r in rows} == {"sdxl"}
    assert {r.id: r.status.value for r in rows if r.id.startswith("runtime.")} == NO_WORKER_COLUMN


def test_residency_reason_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No media libraries anywhere (Werk's own venv has none, no managed environment)."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_MEDIA_PYTHON", raising=False)
    assert importlib.util.find_spec("diffusers") is None  # the dev venv stays without them
    residency = next(r for r in _rows() if r.id == "runtime.model_residency")
    assert residency.reason == (
        "the media libraries (torch, Diffusers, Transformers) are not installed; run "
        "`werk backends install media` (or `pip install werk-media[diffusers]`)"
    )


def test_qwen_residency_reason_names_its_own_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_QWEN_TTS_PYTHON", raising=False)
    residency = next(r for r in _rows(backend="qwen-tts") if r.id == "runtime.model_residency")
    assert residency.reason == "qwen-tts is not installed; run `werk backends install qwen-tts`"


def test_the_qwen_environment_installs_qwen_tts_without_its_declared_dependencies() -> None:
    """qwen-tts declares gradio and torchaudio; the environment leaves both out (the demo UI is
    not needed, torchaudio does not load beside the CPU torch) and pins what it imports."""
    from werk_media.environment import qwen_environment_spec

    spec = qwen_environment_spec()
    assert spec.without_dependencies == ("qwen-tts==0.1.1",)
    assert spec.present == ("qwen_tts",)
    names = {r.split("==")[0].split(">=")[0] for r in spec.requirements}
    assert {"transformers", "accelerate", "torch", "librosa", "soundfile", "sox"} <= names
    assert not names & {"gradio", "torchaudio"}
    assert "transformers==4.57.3" in spec.requirements


def test_only_the_media_routes_reach_the_backend() -> None:
    routes = _pm().backends["media"].routes
    assert routes == (
        "images.generations", "images.edits", "audio.speech", "audio.transcriptions",
        "classifications",
    )  # fmt: skip


def test_cross_restart_restore_is_not_advertised() -> None:
    assert "runtime.state.restore.cross_restart" not in {r.id for r in _rows()}


def test_the_diffusers_extra_is_the_managed_environment() -> None:
    """`pip install werk-media[diffusers]` and `werk backends install media` install the same."""
    import tomllib

    from werk_media.environment import environment_spec

    project = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extra = tomllib.loads(project.read_text())["project"]["optional-dependencies"]["diffusers"]
    assert tuple(extra) == environment_spec().requirements
