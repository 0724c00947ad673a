"""``werk plugins new`` in a clean venv holding only the ``werk`` wheel, as a plugin author
gets it: the guide's tutorial backend, renamed.

The listings in docs/plugins.md must be ``werk plugins new echo``'s files byte for byte, so the
docs cannot drift from what is tested. Then, in a fresh venv that cannot see the repository:
``werk plugins new acme`` → ``pip install -e './acme[test]'`` → ``python -m werk.testing
--backend acme`` exits 0, and the plugin's own test passes under pytest. Editing the editable
install breaks it on purpose, one way at a time: an over-claimed restore, a ``tier.ram`` claim
the host lowers (a warning; ``--strict`` fails) and a ``cross_restart`` claim whose snapshots
only the generation that wrote them can read; the kit must say which claim is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _venvs import REPO_ROOT, CleanVenv, create_venv, shared_clean_venv

from werk.plugin_template import render_plugin

PLUGINS_MD = REPO_ROOT / "docs" / "plugins.md"
NAME = "acme"
DIST = "werk-acme"

BROKEN_RESTORE = ("    return _state(runtime, data.decode())", '    return _state(runtime, "")')
OVER_CLAIM = (
    "    status, reason = _state_status(context)",
    '    status, reason = CapabilityStatus.EXPERIMENTAL, "trust me"',
)
RAM_CLAIM = ("STATE_ROWS = (\n", "STATE_ROWS = (\n    CapabilityId.STATE_TIER_RAM,\n")
CROSS_CLAIM = (
    "STATE_ROWS = (\n",
    "STATE_ROWS = (\n    CapabilityId.STATE_RESTORE_CROSS_RESTART,\n",
)
# Snapshots keyed by the runtime generation: readable only by the process that wrote them.
GENERATION_KEYED = (
    (
        "hashlib.sha256(data).digest() + data",
        "hashlib.sha256(data + _key(runtime)).digest() + data",
    ),
    (
        "hashlib.sha256(data).digest() != digest",
        "hashlib.sha256(data + _key(runtime)).digest() != digest",
    ),
    (
        "def _prompt(",
        "def _key(runtime: Runtime) -> bytes:\n"
        "    return runtime.generation.encode()\n\n\n"
        "def _prompt(",
    ),
)


def _listings() -> dict[str, str]:
    """``{file name: listing}`` for every "`echo/NAME`:" block in the guide."""
    text = PLUGINS_MD.read_text(encoding="utf-8")
    pattern = re.compile(r"^`echo/([^`]+)`:\n\n```[a-z]*\n(.*?)^```$", re.M | re.S)
    return {m.group(1): m.group(2) for m in pattern.finditer(text)}


def test_the_guide_lists_the_template_files_exactly() -> None:
    listings = _listings()
    files = render_plugin("echo")
    assert sorted(listings) == ["pyproject.toml", "tests/test_werk_echo.py", "werk_echo.py"]
    for name, listing in listings.items():
        assert listing == files[name], f"{name} drifted from `werk plugins new echo`"


# -- in a clean venv with only the werk wheel ----------------------------------------------------


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CleanVenv]:
    """A venv with the ``werk`` wheel, then ``werk plugins new acme`` installed editable."""
    shared = shared_clean_venv(tmp_path_factory)  # builds (and reuses) the werk wheel
    env = create_venv(tmp_path_factory.mktemp("acme-venv"), {"werk": shared.wheels["werk"]})
    made = env.run(env.bin / "werk", "plugins", "new", NAME)
    assert f"Wrote plugin {DIST}" in made.stdout, made.stdout
    env.pip("install", "-e", f"./{NAME}[test]")
    yield env


def _module(venv: CleanVenv) -> Path:
    return venv.workdir / NAME / "werk_acme.py"


def _kit(venv: CleanVenv, *args: str) -> tuple[int, str]:
    result = venv.run(venv.python, "-m", "werk.testing", "--backend", NAME, *args, check=False)
    return result.returncode, result.stdout + result.stderr


class _Edited:
    """The editable plugin's module with replacements applied, restored afterwards."""

    def __init__(self, venv: CleanVenv, *replacements: tuple[str, str]) -> None:
        self.path = _module(venv)
        self.original = self.path.read_text(encoding="utf-8")
        self.replacements = replacements

    def __enter__(self) -> None:
        source = self.original
        for old, new in self.replacements:
            assert source.count(old) == 1, old
            source = source.replace(old, new)
        self.path.write_text(source, encoding="utf-8")

    def __exit__(self, *exc: object) -> None:
        self.path.write_text(self.original, encoding="utf-8")


@pytest.mark.slow
def test_a_new_plugin_installs_and_passes_the_kit(venv: CleanVenv) -> None:
    rows = venv.werk_json("plugins")["plugins"]
    assert [(r["name"], r["status"], r["backends"]) for r in rows] == [(DIST, "loaded", [NAME])]
    assert rows[0]["hooks"] == [
        "werk_capabilities",
        "werk_decode",
        "werk_openai",
        "werk_prefill",
        "werk_register_backends",
        "werk_restore",
        "werk_snapshot",
    ]
    code, output = _kit(venv, "--strict")
    assert code == 0, output
    assert re.search(r"^  \d+ passed, 0 failed$", output, re.M), output
    for check in (
        "restore",
        "corrupted restore refused",
        "decode stop",
        "auto retention",
        "runtime restart",
        "/v1 text completion",
        "claim runtime.state.restore experimental",
        "claim runtime.pd.decode experimental",
    ):
        assert f"PASS  {check}" in output, output


@pytest.mark.slow
def test_the_new_plugins_own_test_passes(venv: CleanVenv) -> None:
    result = venv.run(venv.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", NAME)
    assert re.search(r"^1 passed", result.stdout, re.M), result.stdout


@pytest.mark.slow
def test_the_host_reports_what_the_plugin_lacks(venv: CleanVenv) -> None:
    rows: list[dict[str, Any]] = venv.werk_json("capabilities")["capabilities"]
    mine = {r["id"]: r for r in rows if r["backend"] == NAME}
    assert mine["runtime.model_residency"]["status"] == "supported"
    assert mine["runtime.state.restore"]["status"] == "unavailable"  # no runtime in the CLI
    experts = mine["runtime.experts.residency"]
    assert experts["status"] == "unsupported"
    assert experts["reason"] == (
        f"backend {NAME!r} implements no werk_observe_experts or werk_move_experts hook"
    )
    assert mine["runtime.state.tier.ram"]["status"] == "unsupported"


@pytest.mark.slow
def test_an_over_claimed_restore_fails_the_kit_naming_the_row(venv: CleanVenv) -> None:
    with _Edited(venv, BROKEN_RESTORE, OVER_CLAIM):
        code, output = _kit(venv)
    assert code == 1, output
    assert re.search(
        r"^  FAIL  claim runtime\.state\.restore experimental: not proven", output, re.M
    ), output
    assert "FAIL  restore" in output
    assert _kit(venv)[0] == 0  # the file is restored: the kit passes again


@pytest.mark.slow
def test_a_ram_tier_claim_the_host_lowers_is_a_warning_and_fails_strict(venv: CleanVenv) -> None:
    with _Edited(venv, RAM_CLAIM):
        code, output = _kit(venv)
        strict, strict_output = _kit(venv, "--strict")
    assert code == 0, output
    assert re.search(
        r"^  WARN  host lowered runtime\.state\.tier\.ram: the plugin claims experimental, "
        r"the host reports unsupported",
        output,
        re.M,
    ), output
    assert re.search(r"^  \d+ passed, 0 failed, 1 warning$", output, re.M), output
    assert strict == 1, strict_output


@pytest.mark.slow
def test_a_cross_restart_claim_without_the_ability_fails_naming_the_claim(
    venv: CleanVenv,
) -> None:
    with _Edited(venv, CROSS_CLAIM, *GENERATION_KEYED):
        code, output = _kit(venv)
    assert code == 1, output
    assert re.search(
        r"^  FAIL  claim runtime\.state\.restore\.cross_restart experimental: not proven: "
        r"cross-restart restore did not pass",
        output,
        re.M,
    ), output
    assert re.search(r"^  FAIL  cross-restart restore: ", output, re.M), output
    # Within one generation the keyed snapshots still work: only the cross-restart claim fails.
    assert "PASS  restored continuation" in output
