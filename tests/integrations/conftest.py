"""Fixtures of the integration tests: the ComfyUI node pack (``integrations/comfyui-werk``) and
the n8n package (``integrations/n8n-nodes-werk``)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest
from _integration_support import DEMO, IMAGE, KEY, OTHER_KEY, TTS
from werk_llamacpp.executable import locate_llama_server

from werk.testing.server import WERK, WerkServer, server_env, werk_serve

BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")  # read before a test's hermetic environment
LLAMA_SERVER = locate_llama_server().path


@pytest.fixture(scope="session")
def werk_env() -> dict[str, str]:
    """What a test's ``werk serve`` needs: the managed backend environments (``make test``
    installs them; missing is a failure) and the llama-server build (missing: a skip, which
    ``.ci/run`` turns into a failure)."""
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make media-env)")
    if LLAMA_SERVER is None:
        pytest.skip("no llama-server executable on this machine")
    return {"WERK_BACKENDS_DIR": BACKENDS, "WERK_LLAMA_SERVER": str(LLAMA_SERVER)}


@pytest.fixture(scope="package")
def served(
    tmp_path_factory: pytest.TempPathFactory, werk_env: dict[str, str]
) -> Iterator[WerkServer]:
    """A real ``werk serve`` with two API keys and the demo models: the llama.cpp demo, a tiny
    Diffusers pipeline and a tiny VITS speech model (``werk models create-demo``)."""
    home = tmp_path_factory.mktemp("comfy-nodes") / "home"
    home.mkdir()
    for made in (
        ["models", "create-demo", "--id", DEMO],
        ["models", "create-demo", "--kind", "image", "--id", IMAGE],
        ["models", "create-demo", "--kind", "tts", "--id", TTS],
    ):
        subprocess.run(
            [str(WERK), *made],
            check=True,
            capture_output=True,
            env=server_env(home, None, werk_env),
        )
    args = ["--api-key", KEY, "--api-key", OTHER_KEY]
    with werk_serve(home, None, args, env=werk_env, startup_timeout=120) as running:
        yield running
