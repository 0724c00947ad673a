"""Fixtures for the chat tests: both test plugins installed once per session."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _chat_support import install_plugins

SERVER_HELPERS = str(Path(__file__).resolve().parents[1] / "server")
if SERVER_HELPERS not in sys.path:
    sys.path.append(SERVER_HELPERS)  # tests/server/_server.py: a real `werk serve` subprocess


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_plugins(tmp_path_factory.mktemp("chat-plugins"))


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private WERK_HOME for the ``werk`` subprocesses (not exported to this process)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_leftover_children(tmp_path: Path) -> Iterator[None]:
    """If a test failed before its runtime was stopped, kill the stand-in's ``sleep`` child
    (found through the ``*.pid`` markers under this test's directory) so none outlives it."""
    yield
    for pid_file in tmp_path.rglob("*.standin.pid"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(pid_file.read_text())
            if b"sleep" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
