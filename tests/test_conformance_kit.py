"""The conformance kit (``werk.testing``) on the template plugin ``werk plugins new`` writes,
loaded in process: every check passes on it, each deliberate break is named, ``files=`` and
:func:`werk.testing.model_spec` give the identity ``werk models import`` gives, an exception is
attributed to the host or the plugin by where it was raised, and the functional probe helper
``werk.probe_state_hooks`` fails on what it must fail on."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

import werk
import werk.testing
from werk.models import ModelRegistry
from werk.plugin_template import render_plugin, validate_plugin_name, write_plugin
from werk.protocol import Conflict, InvalidRequest
from werk.testing import ConformanceReport

Edit = tuple[str, str]


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[Callable[..., tuple[ModuleType, werk.WerkPluginManager]]]:
    """Render the template as ``name``, apply edits, import it, and give a plugin manager
    holding only it."""
    loaded: list[str] = []

    def load(name: str = "acme", *edits: Edit) -> tuple[ModuleType, werk.WerkPluginManager]:
        made = write_plugin(name, tmp_path / name)
        path = made.directory / f"{made.module}.py"
        source = path.read_text(encoding="utf-8")
        for old, new in edits:
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        path.write_text(source, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(made.module, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[made.module] = module
        loaded.append(made.module)
        spec.loader.exec_module(module)
        pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[(made.distribution, module)])
        return module, pm

    yield load
    for name in loaded:
        sys.modules.pop(name, None)


def _lines(report: ConformanceReport) -> dict[str, str]:
    return {c.name: c.line() for c in report.checks}


# -- the template ----------------------------------------------------------------------------


def test_the_template_passes_every_check_strictly(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]], tmp_path: Path
) -> None:
    _module, pm = plugin("acme")
    report = werk.testing.conformance("acme", pm=pm, home=tmp_path / "home")
    assert report.ok_strictly(), report.summary()
    passed = {c.name for c in report.checks if c.passed}
    assert {
        "/v1 text completion",
        "/v1 streamed text completion",
        "decode stop",
        "decode seed (temperature 0.9)",
        "auto retention",
        "runtime restart",
        "claim runtime.model_residency supported",
        "claim runtime.pd.decode experimental",
        "claim runtime.state.persistence experimental",
    } <= passed, report.summary()
    # It does not claim cross-restart restore, and the host refused the earlier state.
    cross = _lines(report)["cross-restart restore"]
    assert cross.startswith("SKIP  cross-restart restore: refused: incompatible_state"), cross


def test_a_decode_that_ignores_stop_fails_the_decode_claim(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]], tmp_path: Path
) -> None:
    _module, pm = plugin(
        "acme",
        (
            "call.max_tokens, call.stop)",
            "call.max_tokens)",
        ),
    )
    report = werk.testing.conformance("acme", pm=pm, home=tmp_path / "home")
    lines = _lines(report)
    assert lines["decode stop"].startswith("FAIL  decode stop: stop 'quic': 'The quic'"), lines
    assert lines["claim runtime.pd.decode experimental"] == (
        "FAIL  claim runtime.pd.decode experimental: not proven: decode stop did not pass"
    )


def test_a_lowered_claim_is_a_warning_and_strict_fails(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]], tmp_path: Path
) -> None:
    _module, pm = plugin(
        "acme", ("STATE_ROWS = (\n", "STATE_ROWS = (\n    CapabilityId.STATE_TIER_VRAM,\n")
    )
    report = werk.testing.conformance("acme", pm=pm, home=tmp_path / "home")
    assert report.ok and not report.ok_strictly(), report.summary()
    [warning] = report.warnings
    assert warning.line().startswith(
        "WARN  host lowered runtime.state.tier.vram: the plugin claims experimental, "
        "the host reports unsupported: "
    )
    assert report.summary().endswith(", 0 failed, 1 warning")
    report.raise_for_failures()
    with pytest.raises(werk.testing.ConformanceError, match=r"tier\.vram"):
        report.raise_for_failures(strict=True)


# -- files and identities --------------------------------------------------------------------


def test_files_give_the_identity_werk_models_import_gives(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]],
    tmp_path: Path,
    werk_conformance: Callable[..., ConformanceReport],
) -> None:
    _module, pm = plugin("echo")
    model = tmp_path / "model.txt"
    model.write_text("hello\n")
    spec = werk.testing.model_spec([str(model)], "echo")  # a str path is fine
    imported = ModelRegistry(tmp_path / "registry").import_files(
        [model], model_id="conformance", backend="echo"
    )
    assert spec.identity == imported.identity
    assert spec.files == (model,)
    report = werk_conformance("echo", files=[model], pm=pm, strict=True)
    assert report.passed("runtime start")
    with pytest.raises(InvalidRequest, match="is not a regular file"):
        werk.testing.model_spec([tmp_path / "missing.txt"], "echo")
    with pytest.raises(TypeError, match="model or files"):
        werk.testing.conformance("echo", spec, files=[model], pm=pm)


def test_the_cli_takes_files_and_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from werk.testing.__main__ import main

    assert main(["--backend", "echo", "--file", str(tmp_path / "missing.bin")]) == 2
    assert "is not a regular file" in capsys.readouterr().err


# -- who raised ------------------------------------------------------------------------------


def test_an_exception_in_host_code_is_named_as_the_hosts(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _module, pm = plugin("acme")

    def broken(files: Any) -> Any:
        return Path.is_dir(files[0])  # raises inside pathlib, called from the host

    monkeypatch.setattr("werk.control.runtimes.ModelFileLease.acquire", broken)
    spec = werk.ModelSpec(id="m", backend="acme", identity="sha256:" + "0" * 64)
    report = werk.testing.conformance("acme", spec, pm=pm, home=tmp_path / "home")
    line = _lines(report)["runtime start"]
    assert line.startswith("FAIL  runtime start: the host raised IndexError: "), line
    assert "in host code at werk/control/runtimes.py:" in line, line


def test_a_host_function_the_plugin_called_wrongly_names_both_places(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]], tmp_path: Path
) -> None:
    _module, pm = plugin(
        "acme",
        (
            "    engine = Engine()\n",
            "    engine = Engine()\n    ModelSpec(id='m', backend='a', identity='x', files=42)\n",
        ),
    )
    report = werk.testing.conformance("acme", pm=pm, home=tmp_path / "home")
    line = _lines(report)["runtime start"]
    assert "the host raised a plain TypeError" in line, line
    assert "in host code at werk/backends.py:" in line, line
    assert "called from the plugin at werk_acme.py:" in line and "in start" in line, line


def test_a_plain_exception_in_plugin_code_is_the_plugins(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]], tmp_path: Path
) -> None:
    _module, pm = plugin(
        "acme",
        (
            "    if not isinstance(max_tokens, int) or max_tokens < 1:\n",
            "    if body.get('messages') == 'not a list':\n"
            "        raise ValueError('oops')\n"
            "    if not isinstance(max_tokens, int) or max_tokens < 1:\n",
        ),
    )
    report = werk.testing.conformance("acme", pm=pm, home=tmp_path / "home")
    line = _lines(report)["/v1 malformed request refused"]
    assert line.startswith(
        "FAIL  /v1 malformed request refused: the plugin raised a plain ValueError (oops)"
    ), line


# -- werk plugins new ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["acme", "my-backend", "x2_y"])
def test_every_valid_name_renders_a_module_that_compiles(name: str) -> None:
    files = render_plugin(name)
    ident = name.replace("-", "_")
    assert sorted(files) == sorted(
        ["pyproject.toml", "README.md", f"werk_{ident}.py", f"tests/test_werk_{ident}.py"]
    )
    for path, text in files.items():
        if path.endswith(".py"):
            compile(text, path, "exec")
    assert f'BACKEND = "{name}"' in files[f"werk_{ident}.py"]
    assert f'{name} = "werk_{ident}"' in files["pyproject.toml"]


@pytest.mark.parametrize("name", ["", "Acme", "1x", "a--b", "a b", "a/b", "x" * 41, "_a"])
def test_bad_names_are_refused_saying_what_is_allowed(name: str) -> None:
    with pytest.raises(InvalidRequest, match="lowercase letters and digits"):
        validate_plugin_name(name)


def test_the_command_writes_the_plugin_and_never_overwrites(tmp_path: Path) -> None:
    from werk.cli import app

    runner = CliRunner()
    target = tmp_path / "acme"
    result = runner.invoke(app, ["plugins", "new", "acme", "-d", str(target), "--json"])
    assert result.exit_code == 0, result.output
    import json

    body = json.loads(result.stdout)
    assert body["distribution"] == "werk-acme" and body["module"] == "werk_acme"
    assert sorted(body["files"]) == sorted(
        ["pyproject.toml", "README.md", "werk_acme.py", "tests/test_werk_acme.py"]
    )
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    again = runner.invoke(app, ["plugins", "new", "acme", "-d", str(target)])
    assert again.exit_code == 1
    assert "already exists and is not an empty directory" in again.output
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    with pytest.raises(Conflict):
        write_plugin("acme", target)


# -- the probe helper ------------------------------------------------------------------------


def _probe(module: ModuleType, **overrides: Any) -> werk.StateProbe:
    async def run() -> werk.StateProbe:
        runtime = await module.start(werk.ModelSpec(id="m", backend="acme", identity="x"))
        hooks = {
            "prefill": module.werk_prefill,
            "decode": module.werk_decode,
            "snapshot": module.werk_snapshot,
            "restore": module.werk_restore,
            **overrides,
        }
        return await werk.probe_state_hooks(runtime, **hooks)

    return anyio.run(run)


def test_the_probe_passes_on_working_hooks_and_names_what_failed(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]],
) -> None:
    module, _pm = plugin("acme")
    ok = _probe(module)
    assert ok.passed and ok.reason == "a restored state continued with 'pro'", ok

    def forgetful_restore(runtime: werk.Runtime, payload: werk.BackendState) -> werk.BackendState:
        return module._state(runtime, "other")

    wrong = _probe(module, restore=forgetful_restore)
    assert not wrong.passed
    assert wrong.reason == "a restored state continued with 'oth', the live one with 'pro'"

    def credulous_restore(runtime: werk.Runtime, payload: werk.BackendState) -> werk.BackendState:
        return module._state(runtime, "probe")

    assert _probe(module, restore=credulous_restore).reason == "a snapshot cut in half was restored"

    async def failing_snapshot(runtime: werk.Runtime, state: werk.BackendState) -> Any:
        raise OSError("disk gone")

    failed = _probe(module, snapshot=failing_snapshot)
    assert failed.reason == "the probe's snapshot raised OSError: disk gone", failed


def test_the_probe_calls_erase_between_snapshot_and_restore(
    plugin: Callable[..., tuple[ModuleType, werk.WerkPluginManager]],
) -> None:
    module, _pm = plugin("acme")
    erased: list[werk.BackendState] = []

    async def erase(runtime: werk.Runtime, state: werk.BackendState) -> None:
        erased.append(state)

    assert _probe(module, erase=erase).passed
    assert [s.handle for s in erased] == ["probe"]
