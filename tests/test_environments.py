"""Managed backend environments (``werk.environments``) with a real venv and pip, offline.

The "heavy" dependency is a tiny wheel built here from a generated project, so pip needs no
index: install, record, the import check, removals, a spec change making the environment
outdated, a failing install that leaves the previous environment in place and no leftovers, and
one install at a time.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path

import pytest

import werk
from werk import EnvironmentSpec, EnvironmentState, ManagedEnvironment

pytestmark = pytest.mark.slow


def _spec(wheel: Path, **changes: object) -> EnvironmentSpec:
    fields: dict[str, object] = {
        "name": "tiny",
        "description": "a test environment",
        "requirements": (str(wheel),),
        "imports": ("tinypkg",),
        "environment": {"PIP_NO_INDEX": "1"},
    }
    fields.update(changes)
    return EnvironmentSpec(**fields)  # type: ignore[arg-type]


def test_install_records_checks_and_publishes(tiny_wheel: Path, tmp_path: Path) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    spec = _spec(tiny_wheel)
    assert env.status(spec).state is EnvironmentState.MISSING
    assert "werk backends install tiny" in env.status(spec).detail
    steps: list[werk.InstallStep] = []
    status = env.install(spec, progress=steps.append)
    assert status.state is EnvironmentState.READY
    assert status.distributions["tinypkg"] == "1.0"
    assert [s.label for s in steps if s.line is None] == [
        "create the virtual environment",
        "pip install 1 requirement(s)",
        "check the imports",
        "publish",
    ]
    assert {s.total for s in steps} == {4}
    python = env.ready_python(spec)
    assert python == tmp_path / "backends" / "tiny" / "venv" / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import tinypkg; print(tinypkg.VALUE)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "42"
    record = json.loads(env.record_path.read_text())
    assert record["spec_digest"] == spec.digest() and record["requirements"] == [str(tiny_wheel)]
    assert oct(env.record_path.stat().st_mode & 0o777) == "0o600"
    assert "Successfully installed tinypkg-1.0" in env.log_path.read_text()
    leftovers = [p.name for p in env.root.iterdir() if p.name.startswith(".venv-")]
    assert leftovers == []


def test_a_changed_spec_is_outdated_and_never_used(tiny_wheel: Path, tmp_path: Path) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    env.install(_spec(tiny_wheel))
    changed = _spec(tiny_wheel, imports=("tinypkg", "json"))
    assert env.status(changed).state is EnvironmentState.OUTDATED
    assert env.ready_python(changed) is None
    assert env.ready_python(_spec(tiny_wheel)) is not None


def test_removals_run_after_the_install(tiny_wheel: Path, tmp_path: Path) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    status = env.install(_spec(tiny_wheel, remove=("tinypkg",), imports=()))
    assert status.state is EnvironmentState.READY
    assert "tinypkg" not in status.distributions


def test_without_dependencies_installs_with_no_deps_and_present_only_finds(
    tiny_wheel: Path, needy_wheel: Path, tmp_path: Path
) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    spec = _spec(tiny_wheel, without_dependencies=(str(needy_wheel),), present=("needypkg",))
    steps: list[werk.InstallStep] = []
    status = env.install(spec, progress=steps.append)
    assert status.state is EnvironmentState.READY
    assert status.distributions["needypkg"] == "1.0"
    assert "no-such-distribution-anywhere" not in status.distributions
    assert [s.label for s in steps if s.line is None][2] == f"pip install --no-deps {needy_wheel}"
    assert json.loads(env.record_path.read_text())["without_dependencies"] == [str(needy_wheel)]
    assert spec.digest() != _spec(tiny_wheel).digest()
    missing = _spec(tiny_wheel, present=("no_such_module_here",))
    with pytest.raises(werk.Unavailable, match="check the imports"):
        env.install(missing)
    assert "no_such_module_here is missing" in env.log_path.read_text()


def test_a_failed_install_keeps_the_previous_environment(tiny_wheel: Path, tmp_path: Path) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    good = _spec(tiny_wheel)
    env.install(good)
    before = env.python.resolve()
    broken = _spec(tiny_wheel, imports=("tinypkg", "no_such_module_here"))
    with pytest.raises(werk.Unavailable, match="failed at 'check the imports'") as caught:
        env.install(broken)
    assert "install.log" in caught.value.message
    assert env.status(good).state is EnvironmentState.READY  # untouched
    assert env.python.resolve() == before
    assert [p.name for p in env.root.iterdir() if p.name.startswith(".venv-")] == []
    assert "No module named 'no_such_module_here'" in env.log_path.read_text()


def test_one_install_at_a_time(tiny_wheel: Path, tmp_path: Path) -> None:
    env = ManagedEnvironment(tmp_path, "tiny")
    env.root.mkdir(parents=True)
    fd = os.open(env.root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(werk.Conflict, match="already running"):
            env.install(_spec(tiny_wheel))
    finally:
        os.close(fd)


def test_names_and_specs_are_validated() -> None:
    with pytest.raises(ValueError, match="lower-case"):
        EnvironmentSpec(name="Bad Name", requirements=("x",))
    with pytest.raises(ValueError, match="at least one requirement"):
        EnvironmentSpec(name="empty", requirements=())
    with pytest.raises(werk.InvalidRequest):
        ManagedEnvironment(Path("/tmp"), "../escape")
