"""Where a backend's python comes from (:func:`werk.locate_python`) and a plugin's numeric
settings (:func:`werk.whole_number_setting`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from werk import (
    EnvironmentSpec,
    ManagedEnvironment,
    Unavailable,
    locate_python,
    whole_number_setting,
)

SETTING = "WERK_TOY_PYTHON"


@pytest.fixture(autouse=True)
def private_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("WERK_BACKENDS_DIR", raising=False)
    monkeypatch.delenv(SETTING, raising=False)


def _spec(wheel: Path) -> EnvironmentSpec:
    return EnvironmentSpec(
        name="toy",
        requirements=(str(wheel),),
        imports=("tinypkg",),
        environment={"PIP_NO_INDEX": "1"},
    )


def test_nothing_found_names_the_install_command_and_the_hint(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as raised:
        locate_python(
            _spec(tmp_path / "none.whl"),
            setting=SETTING,
            missing="toy libraries are not installed",
            own=("no_such_module_here",),
            hint=" (or `pip install werk-toy[all]`)",
        )
    assert raised.value.message == (
        "toy libraries are not installed; run `werk backends install toy` "
        "(or `pip install werk-toy[all]`)"
    )


def test_the_setting_wins_and_must_name_an_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SETTING, sys.executable)
    found = locate_python(_spec(tmp_path / "w.whl"), setting=SETTING, missing="x", own=("json",))
    assert found.python == Path(sys.executable) and found.source == SETTING
    monkeypatch.setenv(SETTING, str(tmp_path))
    with pytest.raises(Unavailable, match=f"{SETTING}=.* is not an executable"):
        locate_python(_spec(tmp_path / "w.whl"), setting=SETTING, missing="x")


@pytest.mark.slow
def test_own_and_managed_in_the_order_asked(tiny_wheel: Path, tmp_path: Path) -> None:
    spec = _spec(tiny_wheel)
    own = locate_python(spec, setting=SETTING, missing="x", own=("json",))
    assert own.source == "Werk's own environment" and own.python == Path(sys.executable)
    ManagedEnvironment(tmp_path / "home", "toy").install(spec)
    first = locate_python(spec, setting=SETTING, missing="x", own=("json",))
    assert first.source == "Werk's own environment"  # own_first (the default)
    managed = locate_python(spec, setting=SETTING, missing="x", own=("json",), own_first=False)
    assert managed.source == "the managed toy environment"
    assert managed.python == tmp_path / "home" / "backends" / "toy" / "venv" / "bin" / "python"


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, 3), ("", 3), ("0", 0), ("12", 12), ("x", None), ("-1", None)]
)
def test_a_whole_number_setting(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int | None
) -> None:
    if raw is None:
        monkeypatch.delenv("WERK_TOY_SIZE", raising=False)
    else:
        monkeypatch.setenv("WERK_TOY_SIZE", raw)
    if expected is None:
        with pytest.raises(Unavailable, match=f"WERK_TOY_SIZE={raw!r} is not a whole number >= 0"):
            whole_number_setting("WERK_TOY_SIZE", 3)
    else:
        assert whole_number_setting("WERK_TOY_SIZE", 3) == expected


def test_a_minimum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WERK_TOY_SIZE", "0")
    with pytest.raises(Unavailable, match="is not a whole number >= 1"):
        whole_number_setting("WERK_TOY_SIZE", 1, minimum=1)
