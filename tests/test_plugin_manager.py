"""Plugin loading: real entry points from real ``*.dist-info`` directories, and in-memory plugins.

Broken plugins become ``failed`` rows carrying their error text while every other plugin,
including the four bundled ones installed in the venv, keeps loading.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import werk
from werk import BackendDescriptor, hookimpl
from werk.plugins import LOAD_ENV, TRACE_ENV
from werk.protocol import PluginStatus

MakePM = Callable[..., werk.WerkPluginManager]

BUNDLED = {
    "werk-llamacpp": ["llamacpp"],
    "werk-media": ["media", "qwen-tts"],
    "werk-omlx": ["omlx"],
    "werk-vllm": ["vllm", "vllm-remote"],
}

FakeDist = Callable[..., str]


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDist]:
    """Install a throw-away distribution with a ``werk`` entry point onto ``sys.path``.

    ``importlib.metadata`` finds it exactly as it finds a pip-installed plugin. Returns the
    distribution name; the plugin module gets a unique name so no test sees another's import.
    """
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    modules: list[str] = []

    def install(dist: str, source: str, *, ep_name: str | None = None) -> str:
        module = f"werk_fake_{uuid.uuid4().hex[:10]}"
        modules.append(module)
        (site / f"{module}.py").write_text(textwrap.dedent(source))
        info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
        (info / "entry_points.txt").write_text(f"[werk]\n{ep_name or dist} = {module}\n")
        return dist

    yield install
    for module in modules:
        sys.modules.pop(module, None)


@pytest.fixture
def restore_plugin_logger() -> Iterator[logging.Logger]:
    """Tracing configures the ``werk.plugins`` logger; put it back afterwards."""
    logger = logging.getLogger("werk.plugins")
    handlers, level = list(logger.handlers), logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def _row(pm: werk.WerkPluginManager, name: str) -> Any:
    rows = {r.name: r for r in pm.plugin_rows()}
    assert name in rows, sorted(rows)
    return rows[name]


def _assert_bundled_loaded(pm: werk.WerkPluginManager) -> None:
    for name, backends in BUNDLED.items():
        row = _row(pm, name)
        assert row.status is PluginStatus.LOADED, (name, row.error)
        assert row.backends == backends
        assert row.version is not None
    assert {b for backends in BUNDLED.values() for b in backends} <= set(pm.backends)


# ------------------------------------------------------------------------------------------------
# Real entry points
# ------------------------------------------------------------------------------------------------


def test_bundled_plugins_load_from_entry_points() -> None:
    pm = werk.get_plugin_manager(environ={})
    _assert_bundled_loaded(pm)
    for name in BUNDLED:
        hooks = _row(pm, name).hooks
        assert {"werk_register_backends", "werk_capabilities"} <= set(hooks)


def test_check_pending_passes_for_bundled_plugins() -> None:
    pm = werk.get_plugin_manager(environ={})
    pm.check_pending()  # raises PluginValidationError for a hookimpl without a spec


def test_plugin_raising_on_import_fails_alone(fake_dist: FakeDist) -> None:
    dist = fake_dist("werk-explodes", "raise RuntimeError('boom at import time')\n")
    pm = werk.get_plugin_manager(environ={})
    row = _row(pm, dist)
    assert row.status is PluginStatus.FAILED
    assert row.error == "RuntimeError: boom at import time"
    assert row.backends == [] and row.hooks == []
    assert row.version == "0.0.1"
    _assert_bundled_loaded(pm)


def test_plugin_raising_in_register_fails(fake_dist: FakeDist) -> None:
    dist = fake_dist(
        "werk-badreg",
        """
        from werk import BackendDescriptor, hookimpl

        @hookimpl
        def werk_register_backends(register):
            register(BackendDescriptor(name="halfway"))
            raise ValueError("registry unreachable")
        """,
    )
    pm = werk.get_plugin_manager(environ={})
    row = _row(pm, dist)
    assert row.status is PluginStatus.FAILED
    assert row.error == "ValueError: registry unreachable"
    assert row.backends == []
    assert "halfway" not in pm.backends
    assert pm.get_plugin(dist) is None  # unregistered: its hooks are never called again
    _assert_bundled_loaded(pm)


def test_plugin_with_unknown_hook_fails(fake_dist: FakeDist) -> None:
    dist = fake_dist(
        "werk-bogus",
        """
        from werk import BackendDescriptor, hookimpl

        @hookimpl
        def werk_register_backends(register):
            register(BackendDescriptor(name="bogus"))

        @hookimpl
        def werk_bogus():
            return 1
        """,
    )
    pm = werk.get_plugin_manager(environ={})
    row = _row(pm, dist)
    assert row.status is PluginStatus.FAILED
    assert "werk_bogus" in row.error
    assert "bogus" not in pm.backends
    pm.check_pending()  # the failed plugin left no unverified hookimpl behind
    _assert_bundled_loaded(pm)


def test_duplicate_backend_name_fails_the_second_plugin(fake_dist: FakeDist) -> None:
    # Entry points load in name order, so "zz-dup" comes after the bundled "llamacpp".
    dist = fake_dist(
        "werk-zz-dup",
        """
        from werk import BackendDescriptor, hookimpl

        @hookimpl
        def werk_register_backends(register):
            register(BackendDescriptor(name="llamacpp"))
        """,
        ep_name="zz-dup",
    )
    pm = werk.get_plugin_manager(environ={})
    row = _row(pm, dist)
    assert row.status is PluginStatus.FAILED
    assert "'llamacpp' is already registered by werk-llamacpp" in row.error
    assert pm.owner_of("llamacpp").name == "werk-llamacpp"
    _assert_bundled_loaded(pm)


def test_load_plugins_restricts_to_one() -> None:
    # A distribution name loads every entry point it declares (werk-llamacpp has two).
    pm = werk.get_plugin_manager(environ={LOAD_ENV: "werk-llamacpp"})
    assert [r.name for r in pm.plugin_rows()] == ["werk-llamacpp", "werk-llamacpp:llamacpp-inproc"]
    assert set(pm.backends) == {"llamacpp", "llamacpp-inproc"}
    # An entry point name loads that one only.
    pm = werk.get_plugin_manager(environ={LOAD_ENV: "llamacpp"})
    assert [r.name for r in pm.plugin_rows()] == ["werk-llamacpp"]
    assert set(pm.backends) == {"llamacpp"}


def test_load_plugins_accepts_entry_point_names_and_lists() -> None:
    pm = werk.get_plugin_manager(environ={LOAD_ENV: " media , werk-vllm "})
    assert [r.name for r in pm.plugin_rows()] == ["werk-media", "werk-vllm"]


def test_load_plugins_empty_loads_none() -> None:
    pm = werk.get_plugin_manager(environ={LOAD_ENV: ""})
    assert pm.plugin_rows() == []
    assert pm.backends == {}


def test_load_plugins_unset_loads_all() -> None:
    pm = werk.get_plugin_manager(environ={})
    assert set(BUNDLED) <= {r.name for r in pm.plugin_rows()}


def test_load_plugins_is_read_from_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOAD_ENV, "werk-omlx")
    assert [r.name for r in werk.get_plugin_manager().plugin_rows()] == ["werk-omlx"]


def test_load_plugins_also_filters_a_broken_plugin(fake_dist: FakeDist) -> None:
    fake_dist("werk-explodes", "raise RuntimeError('boom')\n")
    pm = werk.get_plugin_manager(environ={LOAD_ENV: "werk-media"})
    assert [r.name for r in pm.plugin_rows()] == ["werk-media"]


# ------------------------------------------------------------------------------------------------
# In-memory plugins
# ------------------------------------------------------------------------------------------------


class Echo:
    """A plugin object (not a module): pluggy accepts any object carrying hookimpls."""

    def __init__(self, *names: str) -> None:
        self.names = names or ("echo",)

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        for name in self.names:
            register(BackendDescriptor(name=name, formats=("text",)))


def test_in_memory_plugin_loads(make_pm: MakePM) -> None:
    pm = make_pm(("echo-plugin", Echo("echo", "echo2")))
    row = _row(pm, "echo-plugin")
    assert row.status is PluginStatus.LOADED and row.error is None
    assert row.backends == ["echo", "echo2"]
    assert row.hooks == ["werk_register_backends"]
    assert pm.owner_of("echo2").name == "echo-plugin"
    assert pm.backends["echo"].formats == ("text",)


def test_duplicate_backend_in_memory(make_pm: MakePM) -> None:
    pm = make_pm(("first", Echo("shared")), ("second", Echo("other", "shared")))
    assert _row(pm, "first").status is PluginStatus.LOADED
    second = _row(pm, "second")
    assert second.status is PluginStatus.FAILED
    assert "'shared' is already registered by first" in second.error
    # All or nothing: the second plugin's non-conflicting backend is not registered either.
    assert set(pm.backends) == {"shared"}


class RegistersJunk:
    @hookimpl
    def werk_register_backends(self, register: Callable[[Any], None]) -> None:
        register({"name": "not-a-descriptor"})


class RegistersBadName:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="Upper Case"))


def test_register_rejects_non_descriptors(make_pm: MakePM) -> None:
    pm = make_pm(("junk", RegistersJunk()), ("bad-name", RegistersBadName()), ("ok", Echo()))
    assert "TypeError" in _row(pm, "junk").error
    assert "ValueError" in _row(pm, "bad-name").error
    assert _row(pm, "ok").status is PluginStatus.LOADED
    assert set(pm.backends) == {"echo"}


def test_unknown_backend_has_no_owner(make_pm: MakePM) -> None:
    pm = make_pm(("echo", Echo()))
    with pytest.raises(werk.Unsupported, match="nowhere"):
        pm.owner_of("nowhere")


def test_managers_share_no_state(make_pm: MakePM) -> None:
    shared = Echo("both")
    one = make_pm(("a", Echo("only-one")), ("shared", shared))
    two = make_pm(("b", Echo("only-two")), ("shared", shared))
    assert set(one.backends) == {"only-one", "both"}
    assert set(two.backends) == {"only-two", "both"}
    assert _row(two, "shared").status is PluginStatus.LOADED  # not "already registered"
    one.unregister(shared)
    assert two.get_plugin("shared") is shared
    assert werk.get_plugin_manager(load_entrypoints=False).plugin_rows() == []


def test_trace_plugins_logs_hook_calls(
    restore_plugin_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="werk.plugins")
    werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("tracer", Echo("traced"))], environ={TRACE_ENV: "1"}
    )
    messages = [r.getMessage() for r in caplog.records if r.name == "werk.plugins"]
    assert "call werk_register_backends(register) -> [tracer]" in messages
    assert "done werk_register_backends" in messages


@pytest.mark.parametrize("value", ["", "0"])
def test_trace_plugins_off(
    value: str, restore_plugin_logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="werk.plugins")
    werk.get_plugin_manager(
        load_entrypoints=False, plugins=[("quiet", Echo())], environ={TRACE_ENV: value}
    )
    assert not [r for r in caplog.records if r.getMessage().startswith("call ")]


def test_trace_plugins_reaches_stderr_of_the_cli() -> None:
    werk_exe = Path(sys.executable).with_name("werk")
    env = {"PATH": "/usr/bin:/bin", TRACE_ENV: "1", LOAD_ENV: "werk-media"}
    proc = subprocess.run(
        [str(werk_exe), "plugins", "--json"], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "werk.plugins: call werk_register_backends(register) -> [werk-media]" in proc.stderr


def test_importing_werk_loads_no_plugin() -> None:
    code = (
        "import sys, werk, werk.cli, werk.capabilities\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('werk_')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
    # The same probe does see plugin modules once a manager loads entry points.
    loaded = code.replace("werk.capabilities\n", "werk.capabilities\nwerk.get_plugin_manager()\n")
    proc = subprocess.run(
        [sys.executable, "-c", loaded], capture_output=True, text=True, check=True
    )
    assert "werk_llamacpp" in proc.stdout
