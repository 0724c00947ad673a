"""The n8n package ``integrations/n8n-nodes-werk``: its manifest follows n8n's rules for strict
community packages, its TypeScript build and n8n's own lint pass (``make n8n-nodes`` runs both
before the suite; this checks the build is there and repeats the lint), and its ``node --test``
suite runs every operation against a real ``werk serve`` with the demo models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from _integration_support import KEY, N8N_PACKAGE

from werk.testing.server import WerkServer

pytestmark = pytest.mark.slow


def _node_modules() -> None:
    if not (N8N_PACKAGE / "node_modules" / ".bin" / "n8n-node").exists():
        pytest.fail("integrations/n8n-nodes-werk has no node_modules: run `make n8n-nodes`")


def test_the_manifest_is_a_strict_community_package() -> None:
    manifest = json.loads((N8N_PACKAGE / "package.json").read_text())
    assert manifest["name"].startswith("n8n-nodes-")
    assert "n8n-community-node-package" in manifest["keywords"]
    assert manifest["files"] == ["dist"]
    assert "dependencies" not in manifest  # strict: nothing installed at runtime
    assert manifest["peerDependencies"] == {"@n8n/ai-node-sdk": "*", "n8n-workflow": "*"}
    n8n = manifest["n8n"]
    assert n8n["n8nNodesApiVersion"] == 1 and n8n["strict"] is True
    assert n8n["aiNodeSdkVersion"] == 1  # the Werk Chat Model node (n8n 2.16+)
    for built in n8n["credentials"] + n8n["nodes"]:
        assert (N8N_PACKAGE / built).is_file(), f"{built} is not built: run `make n8n-nodes`"
    lock = json.loads((N8N_PACKAGE / "package-lock.json").read_text())
    assert lock["packages"][""]["devDependencies"] == manifest["devDependencies"]


def test_n8ns_lint_passes_in_strict_mode() -> None:
    _node_modules()
    linted = subprocess.run(
        ["npx", "--no-install", "n8n-node", "lint"],
        cwd=N8N_PACKAGE, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert linted.returncode == 0, linted.stdout[-4000:] + linted.stderr[-2000:]


def test_every_operation_against_a_real_werk_serve(served: WerkServer) -> None:
    _node_modules()
    node = shutil.which("node")
    assert node, "Node.js is needed for the n8n package's tests"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_URL=served.base_url, WERK_API_KEY=KEY)
    ran = subprocess.run(
        [node, "--test", "test/"], cwd=N8N_PACKAGE, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-2000:]
    assert "# fail 0" in ran.stdout and "# pass 9" in ran.stdout, ran.stdout[-2000:]
