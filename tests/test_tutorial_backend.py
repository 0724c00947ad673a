"""The tutorial backend of docs/plugins.md (``docs/tutorial/werk-echo``), as a user gets it.

The listings in docs/plugins.md must be the tutorial's files byte for byte, so the docs cannot
drift from what is tested. The tutorial is then built from those files into a wheel and
installed, with only the ``werk`` wheel, into a fresh venv that cannot see the repository; there
the documented one-liner ``python -m werk.testing --backend echo`` must pass, the plugin's rows
must join the matrix with the host's ``unsupported`` rows for what it lacks, and a copy of the
tutorial that over-claims ``runtime.state.restore`` while its restore is broken must make the kit
fail naming that row.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _venvs import REPO_ROOT, CleanVenv, build_wheel, create_venv, shared_clean_venv

TUTORIAL = REPO_ROOT / "docs" / "tutorial" / "werk-echo"
PLUGINS_MD = REPO_ROOT / "docs" / "plugins.md"
DIST = "werk-echo"

# The over-claim: restore loses the text, and the rows say experimental whatever the probe found.
BROKEN_RESTORE = ("    return _state(runtime, data.decode())", '    return _state(runtime, "")')
OVER_CLAIM = (
    "    status, reason = _state_status(context)",
    '    status, reason = CapabilityStatus.EXPERIMENTAL, "trust me"',
)


def _listings() -> dict[str, str]:
    """``{file name: listing}`` for every "`docs/tutorial/werk-echo/NAME`:" block in the guide."""
    text = PLUGINS_MD.read_text(encoding="utf-8")
    pattern = re.compile(
        r"^`docs/tutorial/werk-echo/([^`]+)`:\n\n```[a-z]*\n(.*?)^```$", re.M | re.S
    )
    return {m.group(1): m.group(2) for m in pattern.finditer(text)}


def test_the_guide_lists_the_tutorial_files_exactly() -> None:
    listings = _listings()
    files = sorted(p.name for p in TUTORIAL.iterdir() if p.suffix in (".py", ".toml"))
    assert sorted(listings) == files == ["pyproject.toml", "werk_echo.py"]
    for name, listing in listings.items():
        assert listing == (TUTORIAL / name).read_text(encoding="utf-8"), f"{name} drifted"


# -- installed from wheels -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CleanVenv]:
    """A venv with exactly the ``werk`` wheel and the tutorial's wheel."""
    shared = shared_clean_venv(tmp_path_factory)  # builds (and reuses) the werk wheel
    wheel = build_wheel(TUTORIAL, tmp_path_factory.mktemp("echo-dist") / "dist")
    yield create_venv(
        tmp_path_factory.mktemp("echo-venv"), {"werk": shared.wheels["werk"], DIST: wheel}
    )


def _kit(venv: CleanVenv) -> tuple[int, str]:
    result = venv.run(venv.python, "-m", "werk.testing", "--backend", "echo", check=False)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.slow
def test_only_werk_and_the_tutorial_are_installed(venv: CleanVenv) -> None:
    rows = venv.werk_json("plugins")["plugins"]
    assert [(r["name"], r["status"], r["backends"]) for r in rows] == [(DIST, "loaded", ["echo"])]
    assert rows[0]["hooks"] == [
        "werk_capabilities",
        "werk_decode",
        "werk_openai",
        "werk_prefill",
        "werk_register_backends",
        "werk_restore",
        "werk_snapshot",
    ]


@pytest.mark.slow
def test_the_documented_one_liner_passes(venv: CleanVenv) -> None:
    code, output = _kit(venv)
    assert code == 0, output
    assert re.search(r"^  \d+ passed, 0 failed$", output, re.M), output
    for check in ("restore", "corrupted restore refused", "claim runtime.state.restore"):
        assert f"PASS  {check}" in output, output


@pytest.mark.slow
def test_the_host_reports_what_the_tutorial_lacks(venv: CleanVenv) -> None:
    rows: list[dict[str, Any]] = venv.werk_json("capabilities")["capabilities"]
    echo = {r["id"]: r for r in rows if r["backend"] == "echo"}
    assert echo["runtime.model_residency"]["status"] == "supported"
    assert echo["runtime.state.restore"]["status"] == "unavailable"  # no runtime in the CLI
    experts = echo["runtime.experts.residency"]
    assert experts["status"] == "unsupported"
    assert experts["reason"] == (
        "backend 'echo' implements no werk_observe_experts or werk_move_experts hook"
    )
    assert echo["runtime.state.tier.ram"]["status"] == "unsupported"


@pytest.mark.slow
def test_an_over_claiming_copy_fails_the_kit_naming_the_row(
    venv: CleanVenv, tmp_path: Path
) -> None:
    broken = tmp_path / "werk-echo"
    shutil.copytree(TUTORIAL, broken)
    module = broken / "werk_echo.py"
    source = module.read_text(encoding="utf-8")
    for old, new in (BROKEN_RESTORE, OVER_CLAIM):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    module.write_text(source, encoding="utf-8")
    wheel = build_wheel(broken, tmp_path / "dist")
    venv.pip("install", "--no-deps", "--force-reinstall", wheel)
    try:
        code, output = _kit(venv)
    finally:
        venv.pip("install", "--no-deps", "--force-reinstall", venv.wheels[DIST])
    assert code == 1, output
    assert re.search(
        r"^  FAIL  claim runtime\.state\.restore experimental: not proven", output, re.M
    )
    assert "FAIL  restore" in output
    # Restored from the good wheel: the kit passes again.
    assert _kit(venv)[0] == 0
