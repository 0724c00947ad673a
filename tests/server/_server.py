"""Starting a real ``werk serve`` subprocess on loopback for end-to-end tests.

The server helpers are :mod:`werk.testing.server` (public: plugin authors use them too); this
module adds what only Werk's own suite needs. The test backend (``tests/test_backend``,
distribution ``werk-test-backend``) is installed into a private ``--target`` directory and put
on the server's ``PYTHONPATH``: the server discovers it through its real entry point, and the
dev virtual environment is never modified.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import httpx

from werk.supervise import free_port
from werk.testing.server import WERK, WerkServer, server_env, werk_serve

__all__ = [
    "KEY_A",
    "KEY_B",
    "WERK",
    "WerkServer",
    "free_port",
    "import_model",
    "install_test_backend",
    "server_env",
    "werk_serve",
]

REPO = Path(__file__).resolve().parents[2]

KEY_A = "key-alpha-0123456789"
KEY_B = "key-bravo-9876543210"
"""The two keys of the ``auth_server`` fixture (conftest.py)."""


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


OPENAI_ROUTES = (
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model_id}"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/embeddings"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/audio/transcriptions"),
    ("POST", "/v1/classifications"),
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{job_id}"),
    ("DELETE", "/v1/jobs/{job_id}"),
    ("GET", "/v1/outputs/{id}"),
)
"""Every OpenAI-compatible route Werk serves (method, path), as the tests expect them."""


SpawnServer = Callable[..., WerkServer]
"""The ``spawn_server`` fixture's factory (conftest.py)."""


class ErrorBodyCheck:
    """Checks one error answer of a live server and remembers its body.

    The answer must carry ``X-Werk-Request-Id`` and a JSON body ``{"error": {"code": <str>,
    "message": <str>, ...}}`` (the protocol shape on ``/werk/v1``, the OpenAI shape on ``/v1``;
    both have these members), and no absolute path may appear in it: not the server's
    ``WERK_HOME``, the test backend's install directory, the interpreter prefix, the repository,
    nor anything under ``/work``, ``/root`` or ``/tmp``.
    """

    ROOTS = ("/work", "/root", "/tmp")

    def __init__(self, site: Path) -> None:
        self.site = site
        self.bodies: list[bytes] = []

    def __call__(
        self,
        server: WerkServer,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        expected: Collection[int],
    ) -> dict[str, object]:
        assert status in expected, (status, body[:300])
        assert "x-werk-request-id" in {k.lower() for k in headers}, headers
        payload = json.loads(body)
        error = payload["error"]
        assert isinstance(error["code"], str) and error["code"], payload
        assert isinstance(error["message"], str), payload
        text = body.decode()
        forbidden = {
            *self.ROOTS,
            str(server.home),
            str(server.home.resolve()),
            str(self.site),
            sys.prefix,
            str(Path(__file__).resolve().parents[2]),
        }
        leaked = sorted(f for f in forbidden if f in text)
        assert not leaked, f"error body contains {leaked}: {text[:300]}"
        self.bodies.append(body)
        return dict(error)

    def response(
        self, server: WerkServer, response: httpx.Response, *expected: int
    ) -> dict[str, object]:
        """Check an ``httpx`` response (see the class docstring)."""
        return self(server, response.status_code, response.headers, response.content, expected)
