"""Shared fixtures of the werk-onnx tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx_testing import GENAI, GENAI_B, RUNNER, werk


@pytest.fixture(scope="session")
def onnx_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WERK_HOME with two tiny ONNX models (seeds 0 and 1, ``werk models create-demo --kind
    onnx``) and the first imported again for ``onnx-runner``, as the README says."""
    home = tmp_path_factory.mktemp("onnx") / "home"
    home.mkdir()
    for model, seed in ((GENAI, "0"), (GENAI_B, "1")):
        made = werk(home, "models", "create-demo", "--kind", "onnx", "--id", model, "--seed", seed)
        assert made.returncode == 0, made.stderr
    folder = home / "models" / "files" / GENAI
    imported = werk(
        home, "models", "import", str(folder), "--id", RUNNER, "--backend", "onnx-runner"
    )
    assert imported.returncode == 0, imported.stderr
    return home
