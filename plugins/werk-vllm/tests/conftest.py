"""Shared fixtures of the werk-vllm tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_testing import MODEL, werk


@pytest.fixture(scope="session")
def vllm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WERK_HOME with the tiny demo model imported as ``tiny-vllm`` (made once per run by
    ``werk models create-demo --kind vllm``, as the README says)."""
    home = tmp_path_factory.mktemp("vllm") / "home"
    home.mkdir()
    made = werk(home, "models", "create-demo", "--kind", "vllm", "--id", MODEL)
    assert made.returncode == 0, made.stderr
    return home
