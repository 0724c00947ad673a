"""Shared fixtures of the werk-media tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from media_testing import IMAGE_A, IMAGE_B, werk


@pytest.fixture(scope="session")
def media_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WERK_HOME with two tiny image pipelines (seeds 0 and 1), made by
    ``werk models create-demo --kind image`` as the README says."""
    home = tmp_path_factory.mktemp("media") / "home"
    home.mkdir()
    for model, seed in ((IMAGE_A, "0"), (IMAGE_B, "1")):
        made = werk(home, "models", "create-demo", "--kind", "image", "--id", model, "--seed", seed)
        assert made.returncode == 0, made.stderr
    return home
