"""The same ``--persistence`` flow against a real oMLX: opt-in, only on macOS on Apple silicon
with ``omlx`` on PATH (elsewhere it is skipped, saying why). Checked by hand where it can run;
this Linux suite runs it skipped."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest
from omlx_testing import KEY, MODEL, chat, werk

from werk.testing.server import werk_serve

REAL = shutil.which("omlx")
APPLE_SILICON = platform.system() == "Darwin" and platform.machine() == "arm64"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (APPLE_SILICON and REAL),
        reason=f"needs macOS on Apple silicon with a real `omlx` on PATH (this is "
        f"{platform.system()} {platform.machine()}, omlx {'found' if REAL else 'not found'})",
    ),
]


def test_a_real_omlx_reports_verified_reuse(omlx_home: Path) -> None:
    args = ["--model", MODEL, "--api-key", KEY, "--persistence"]
    with werk_serve(omlx_home, None, args, env={"WERK_OMLX_BIN": str(REAL)}) as server:
        assert chat(server, "Hello.").status_code == 200
        again = chat(server, "Hello again.")
        assert again.status_code == 200, again.text
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    listed = werk(omlx_home, "cache", "list", "--kind", "worker", "--json")
    assert "worker:werk-omlx/w_" in listed.stdout
