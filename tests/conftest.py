"""Shared fixtures: a hermetic plugin environment, a private WERK_HOME, in-memory managers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import werk
from werk.plugins import LOAD_ENV, TRACE_ENV


@pytest.fixture
def anyio_backend() -> str:
    """Run ``@pytest.mark.anyio`` tests on asyncio (the runtime ``werk serve`` uses)."""
    return "asyncio"


@pytest.fixture(autouse=True)
def _hermetic_plugin_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's ``WERK_LOAD_PLUGINS``/``WERK_TRACE_PLUGINS`` must not change test outcomes."""
    monkeypatch.delenv(LOAD_ENV, raising=False)
    monkeypatch.delenv(TRACE_ENV, raising=False)


@pytest.fixture
def werk_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty store root exported as ``WERK_HOME``."""
    home = tmp_path / "werk-home"
    home.mkdir()
    monkeypatch.setenv("WERK_HOME", str(home))
    return home


MakePM = Callable[..., werk.WerkPluginManager]


@pytest.fixture
def make_pm() -> MakePM:
    """Build a manager from in-memory ``(name, plugin)`` pairs only (no entry points)."""

    def build(*plugins: tuple[str, object]) -> werk.WerkPluginManager:
        return werk.get_plugin_manager(load_entrypoints=False, plugins=list(plugins), environ={})

    return build
