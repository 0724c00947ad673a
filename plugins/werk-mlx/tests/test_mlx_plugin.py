"""werk-mlx: loaded through its real entry point; capability truth without an MLX python; the
runner options checked when a runtime starts."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import anyio
import pytest

import werk
from werk import CapabilityContext, CapabilityReport, InvalidRequest, ModelSpec


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_MLX_PYTHON", raising=False)


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "mlx"]
    assert ep.dist is not None and ep.dist.name == "werk-mlx"
    module = ep.load()
    assert isinstance(module, ModuleType)
    return module


def _residency(model: ModelSpec | None = None) -> CapabilityReport:
    pm = werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-mlx", _plugin())], environ={}
    )
    rows = pm.capabilities(CapabilityContext(backend="mlx", model=model))
    return next(r for r in rows if r.id == "runtime.model_residency")


def _spec(**options: object) -> ModelSpec:
    files = (Path("/m/config.json"), Path("/m/model.safetensors"))
    return ModelSpec(
        id="m", backend="mlx", identity="sha256:" + "b" * 64, files=files, options=options
    )


def test_residency_is_never_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Werk's own test environment has MLX (the oMLX stand-in's extras): the runner can start
    but keeps nothing; without any MLX python the row says what to install."""
    row = _residency()
    assert row.status.value == "unsupported" and "nothing stays loaded" in row.reason
    monkeypatch.setitem(_plugin().LOCATORS, "mlx", _no_mlx)
    missing = _residency()
    assert missing.status.value == "unavailable"
    assert missing.reason == "MLX and mlx-lm are not installed; run `werk backends install mlx`"
    custom = _residency(_spec(runner=["/opt/my-mlx-runner"]))
    assert custom.status.value == "unsupported" and "the model's runner option" in custom.reason


def _no_mlx() -> object:
    raise werk.Unavailable("MLX and mlx-lm are not installed; run `werk backends install mlx`")


def test_a_runtime_starts_nothing_and_checks_its_options() -> None:
    runtime = anyio.run(_plugin().start_runtime, _spec())
    assert runtime.handle.argv[1].endswith("werk_mlx/_runner.py")
    assert runtime.handle.path == Path("/m")
    with pytest.raises(InvalidRequest, match="runner_timeout"):
        anyio.run(_plugin().start_runtime, _spec(runner_timeout=-1))
