"""werk-onnx: loaded through its real entry point; capability truth without an environment;
the ``runner`` and ``runner_timeout`` options checked when a runtime starts."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

import werk
from werk import CapabilityContext, CapabilityReport, InvalidRequest, ModelSpec


@pytest.fixture(autouse=True)
def no_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WERK_BACKENDS_DIR", str(tmp_path / "backends"))
    monkeypatch.delenv("WERK_ONNX_PYTHON", raising=False)


def _plugin() -> ModuleType:
    (ep,) = [ep for ep in entry_points(group=werk.ENTRY_POINT_GROUP) if ep.name == "onnx"]
    assert ep.dist is not None and ep.dist.name == "werk-onnx"
    module = ep.load()
    assert isinstance(module, ModuleType)
    return module


def _pm() -> werk.WerkPluginManager:
    return werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("werk-onnx", _plugin())], environ={}
    )


def _spec(**options: Any) -> ModelSpec:
    return ModelSpec(
        id="m",
        backend="onnx-runner",
        identity="sha256:" + "a" * 64,
        files=(Path("/models/m/genai_config.json"), Path("/models/m/model.onnx")),
        options=options,
    )


def _residency(backend: str, model: ModelSpec | None = None) -> CapabilityReport:
    rows = _pm().capabilities(CapabilityContext(backend=backend, model=model))
    return next(r for r in rows if r.id == "runtime.model_residency")


def test_registers_two_backends_for_onnx_genai_folders() -> None:
    pm = _pm()
    assert set(pm.backends) == {"onnx-genai", "onnx-runner"}
    for name in ("onnx-genai", "onnx-runner"):
        assert pm.backends[name].formats == ("onnx-genai",)
        assert pm.backends[name].routes == ("chat.completions", "completions")
    pm.check_pending()


def test_without_the_environment_both_rows_say_how_to_install_it() -> None:
    genai = _residency("onnx-genai")
    assert genai.status.value == "unavailable"
    assert genai.reason == "ONNX Runtime GenAI is not installed; run `werk backends install onnx`"
    runner = _residency("onnx-runner", _spec())
    assert runner.status.value == "unavailable" and "'runner' option" in runner.reason


def test_a_custom_runner_needs_no_environment_and_keeps_nothing_resident() -> None:
    row = _residency("onnx-runner", _spec(runner=["/bin/my-runner", "--fast"]))
    assert row.status.value == "unsupported"
    assert "no validated residency protocol" in row.reason
    runtime = anyio.run(_plugin().start_runner, _spec(runner="/bin/my-runner --model 'a b'"))
    assert runtime.handle.argv == ("/bin/my-runner", "--model", "a b")
    assert runtime.handle.path == Path("/models/m") and runtime.handle.timeout == 600.0
    again = anyio.run(_plugin().start_runner, _spec(runner="/bin/my-runner --model 'a b'"))
    assert again.generation != runtime.generation


@pytest.mark.parametrize(
    ("options", "text"),
    [
        ({"runner": ""}, "option 'runner' must be"),
        ({"runner": [1, 2]}, "option 'runner' must be"),
        ({"runner": "/bin/r", "runner_timeout": 0}, "'runner_timeout' must be seconds > 0"),
        ({"runner": "/bin/r", "runner_timeout": "soon"}, "'runner_timeout' must be seconds > 0"),
    ],
)
def test_bad_runner_options_are_refused_when_it_starts(options: dict[str, Any], text: str) -> None:
    with pytest.raises(InvalidRequest, match=text):
        anyio.run(_plugin().start_runner, _spec(**options))
