"""Shared fixtures: a hermetic plugin environment, a private WERK_HOME, in-memory managers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import werk
from werk.config import BACKENDS_ENV
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
    # `make test` shares the vLLM environment through WERK_BACKENDS_DIR; tests of the host's
    # environments must build theirs under their own WERK_HOME.
    monkeypatch.delenv(BACKENDS_ENV, raising=False)


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


@pytest.fixture(scope="session")
def tiny_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dependency-free wheel (``tinypkg`` 1.0, ``tinypkg.VALUE == 42``) built here, so pip can
    install something without any package index."""
    return _build_wheel(tmp_path_factory.mktemp("tinypkg"), "tinypkg", "VALUE = 42\n")


@pytest.fixture(scope="session")
def needy_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``needypkg`` 1.0: declares a dependency no index has, and refuses to be imported (as a
    package whose import needs a shim): installable only with ``--no-deps``."""
    return _build_wheel(
        tmp_path_factory.mktemp("needypkg"),
        "needypkg",
        "raise ImportError('needypkg needs a shim')\n",
        dependencies=("no-such-distribution-anywhere",),
    )


def _build_wheel(
    project: Path, name: str, init: str, *, dependencies: tuple[str, ...] = ()
) -> Path:
    (project / name).mkdir()
    (project / name / "__init__.py").write_text(init)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n'
        f"dependencies = {list(dependencies)!r}\n"
        f'[tool.hatch.build.targets.wheel]\npackages = ["{name}"]\n'
    )
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", "dist"],
        cwd=project,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (project / "dist").glob("*.whl")
    return wheel
