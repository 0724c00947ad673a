"""Shared fixtures of the werk-media tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from media_testing import ASR, CLASSIFY, IMAGE_A, IMAGE_B, TTS, werk


@pytest.fixture(scope="session")
def media_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WERK_HOME with two tiny image pipelines (seeds 0 and 1), a speech and a recognition
    model and a text classifier, made by ``werk models create-demo --kind
    image|tts|asr|classify`` as the README says."""
    home = tmp_path_factory.mktemp("media") / "home"
    home.mkdir()
    made_by = (
        (IMAGE_A, "image", "0"),
        (IMAGE_B, "image", "1"),
        (TTS, "tts", "0"),
        (ASR, "asr", "0"),
        (CLASSIFY, "classify", "0"),
    )
    for model, kind, seed in made_by:
        made = werk(home, "models", "create-demo", "--kind", kind, "--id", model, "--seed", seed)
        assert made.returncode == 0, made.stderr
    return home
