"""Fixtures for the ``werk cache`` tests (the chat tests' helpers and test plugins)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
for helpers in (TESTS / "chat", TESTS / "server"):  # _chat_support.py, _server.py
    if str(helpers) not in sys.path:
        sys.path.append(str(helpers))

from _chat_support import install_plugins  # noqa: E402


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugins(tmp_path_factory.mktemp("cache-plugins"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path
