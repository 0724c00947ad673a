"""Shared fixtures of the werk-omlx tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omlx_testing import GENERATOR, MODEL, werk, write_omlx


@pytest.fixture(scope="session")
def omlx_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in ``omlx`` executable (see ``omlx_testing``)."""
    return write_omlx(tmp_path_factory.mktemp("omlx-bin"))


@pytest.fixture(scope="session")
def mlx_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight MLX Llama directory, written once per run."""
    target = tmp_path_factory.mktemp("mlx-model") / "tiny"
    subprocess.run([sys.executable, str(GENERATOR), str(target), "0"], check=True, timeout=300)
    return target


@pytest.fixture
def omlx_home(tmp_path: Path, mlx_model: Path) -> Path:
    """A fresh WERK_HOME with the tiny model imported for backend ``omlx``."""
    home = tmp_path / "home"
    home.mkdir()
    made = werk(home, "models", "import", str(mlx_model), "--id", MODEL, "--backend", "omlx")
    assert made.returncode == 0, made.stderr
    return home
