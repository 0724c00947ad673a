"""The conformance kit (``werk.testing``) against the testkv plugin, installed like a user's
plugin (entry point in a private ``--target`` site) and run with the documented one-liner."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _server import server_env

pytestmark = pytest.mark.slow


def test_testkv_passes_the_conformance_kit(testkv_site: Path, tmp_path: Path) -> None:
    model = tmp_path / "kit.testkv"
    model.write_text("testkv model kit: alpha beta gamma delta\n")
    home = tmp_path / "home"
    home.mkdir()
    env = server_env(home, testkv_site, {"WERK_LOAD_PLUGINS": "werk-test-backend"})
    done = subprocess.run(
        [sys.executable, "-m", "werk.testing", "--backend", "testkv", "--file", str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for check in ("restore", "restored continuation", "corrupted restore refused"):
        assert f"PASS  {check}" in done.stdout, done.stdout
    assert "PASS  claim runtime.pd.handoff experimental" in done.stdout
