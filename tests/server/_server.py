"""Starting a real ``werk serve`` subprocess on loopback for end-to-end tests.

The server helpers are :mod:`werk.testing.server` (public: plugin authors use them too); this
module adds what only Werk's own suite needs. The test backend (``tests/test_backend``,
distribution ``werk-test-backend``) is installed into a private ``--target`` directory and put
on the server's ``PYTHONPATH``: the server discovers it through its real entry point, and the
dev virtual environment is never modified.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from werk.supervise import free_port
from werk.testing.server import WERK, WerkServer, server_env, werk_serve

__all__ = [
    "WERK",
    "WerkServer",
    "free_port",
    "import_model",
    "install_test_backend",
    "server_env",
    "werk_serve",
]

REPO = Path(__file__).resolve().parents[2]


def install_test_backend(target: Path) -> Path:
    """``pip install --target`` the test backend; returns the site directory."""
    site = target / "site"
    if not (site / "werk_test_backend").is_dir():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
                "--target",
                str(site),
                str(REPO / "tests" / "test_backend"),
            ],
            check=True,
            cwd=target,
        )
    return site


def import_model(home: Path, site: Path, model_id: str, seed_text: str = "weights") -> Path:
    """Create a testkv model file and import it with the real CLI."""
    model_file = home.parent / f"{model_id}.testkv"
    model_file.write_text(f"testkv model {model_id}: {seed_text}\n")
    subprocess.run(
        [str(WERK), "models", "import", str(model_file), "--id", model_id, "--backend", "testkv"],
        check=True,
        env=server_env(home, site),
        capture_output=True,
    )
    return model_file
