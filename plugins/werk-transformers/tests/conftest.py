"""Shared fixtures of the werk-transformers tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers_testing import MODEL_A, MODEL_B, werk


@pytest.fixture(scope="session")
def transformers_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WERK_HOME with two tiny Llamas (seeds 0 and 1), made by ``werk models create-demo
    --kind transformers`` as the README says."""
    home = tmp_path_factory.mktemp("transformers") / "home"
    home.mkdir()
    for model, seed in ((MODEL_A, "0"), (MODEL_B, "1")):
        made = werk(home, "models", "create-demo", "--kind", "transformers", "--id", model,
                    "--seed", seed)  # fmt: skip
        assert made.returncode == 0, made.stderr
    return home
