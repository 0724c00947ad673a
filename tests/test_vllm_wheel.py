"""``pip install werk werk-vllm`` from wheels, and no vLLM anywhere: the plugin loads, and its
rows are ``unavailable`` with a reason that names the command that installs vLLM.

Built from this checkout into a fresh venv that cannot see the repository (:mod:`_venvs`);
``WERK_HOME`` is the venv's own, so no managed environment exists, and ``PATH`` has no ``vllm``.
"""

from __future__ import annotations

import pytest
from _venvs import REPO_ROOT, CleanVenv, build_wheel, create_venv, shared_clean_venv

pytestmark = pytest.mark.slow

HINT = "run `werk backends install vllm`"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> CleanVenv:
    shared = shared_clean_venv(tmp_path_factory)  # builds (and reuses) the werk wheel
    plugin = REPO_ROOT / "plugins" / "werk-vllm"
    wheel = build_wheel(plugin, tmp_path_factory.mktemp("vllm-dist") / "dist")
    return create_venv(
        tmp_path_factory.mktemp("vllm-venv"), {"werk": shared.wheels["werk"], "werk-vllm": wheel}
    )


def test_only_werk_and_werk_vllm_are_installed(venv: CleanVenv) -> None:
    rows = venv.werk_json("plugins")["plugins"]
    assert [(r["name"], r["status"], r["backends"]) for r in rows] == [
        ("werk-vllm", "loaded", ["vllm", "vllm-remote"])
    ]


def test_rows_are_unavailable_and_name_the_install_command(venv: CleanVenv) -> None:
    rows = venv.werk_json("capabilities")["capabilities"]
    local = {r["id"]: r for r in rows if r["backend"] == "vllm"}
    for row_id in ("runtime.model_residency", "runtime.state.prefix_cache"):
        assert local[row_id]["status"] == "unavailable"
        assert HINT in local[row_id]["reason"], local[row_id]
    remote = {r["id"]: r for r in rows if r["backend"] == "vllm-remote"}
    assert remote["runtime.model_residency"]["status"] == "unavailable"
    assert "WERK_VLLM_HOST" in remote["runtime.model_residency"]["reason"]
    assert not any(r["status"] in ("supported", "experimental") for r in [*local.values()])


def test_the_install_command_is_offered(venv: CleanVenv) -> None:
    listed = venv.werk_json("backends", "list")
    names = {e["name"]: e for e in listed["environments"]}
    assert names["vllm"]["state"] != "ready"
