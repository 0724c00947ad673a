"""Wheels built from source once and cached (``werk.SourceWheel``), and managed environments that
install them.

The package built here is a real sdist served to a real ``pip wheel`` from a local directory
(``PIP_NO_INDEX`` + ``PIP_FIND_LINKS``: no network); its PEP 517 backend is in the sdist itself
and writes the module with the build setting it was given, so a test can see which settings
reached the build. It stands for llama-cpp-python, whose real build (minutes of CMake) the
llamacpp-inproc tests use through ``make test``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from werk import EnvironmentSpec, ManagedEnvironment, SourceWheel, Unavailable
from werk.environments import EnvironmentState
from werk.source_wheels import build_source_wheel, cached_wheel, source_wheel_cache

NAME = "werk-test-tiny"
VERSION = "1.0"
BACKEND = """
import base64, hashlib, os, time, zipfile

NAME, VERSION = "werk_test_tiny", "1.0"


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    if os.environ.get("TINY_FAIL"):
        raise RuntimeError("the tiny build failed as asked")
    if os.environ.get("TINY_SLOW"):
        time.sleep(float(os.environ["TINY_SLOW"]))
    flag = os.environ.get("TINY_FLAG", "")
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{NAME}-{VERSION}.dist-info"
    files = {
        f"{NAME}.py": f"FLAG = {flag!r}\\n".encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\\nName: werk-test-tiny\\nVersion: {VERSION}\\n"
        ).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\n"
            b"Tag: py3-none-any\\n"
        ),
    }
    lines = [_record_line(p, d) for p, d in files.items()] + [f"{info}/RECORD,,"]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, data in files.items():
            wheel.writestr(path, data)
        wheel.writestr(f"{info}/RECORD", "\\n".join(lines) + "\\n")
    return name
"""
PYPROJECT = f"""
[build-system]
requires = []
build-backend = "tinybackend"
backend-path = ["."]

[project]
name = "{NAME}"
version = "{VERSION}"
"""


def _sdist(directory: Path) -> Path:
    """A real ``werk-test-tiny-1.0.tar.gz`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / f"{NAME}-{VERSION}.tar.gz"
    base = f"{NAME}-{VERSION}"
    members = {
        "pyproject.toml": PYPROJECT.encode(),
        "tinybackend.py": BACKEND.encode(),
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode(),
    }
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in members.items():
            entry = tarfile.TarInfo(f"{base}/{name}")
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return archive


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    links = tmp_path / "links"
    _sdist(links)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("WERK_BUILD_CACHE", str(tmp_path / "cache"))
    for name in ("TINY_FAIL", "TINY_SLOW"):
        monkeypatch.delenv(name, raising=False)
    return links


def _wheel(flag: str = "portable") -> SourceWheel:
    return SourceWheel(name=NAME, version=VERSION, environment={"TINY_FLAG": flag})


def _flag_in(wheel_file: Path) -> str:
    import zipfile

    with zipfile.ZipFile(wheel_file) as archive:
        return archive.read("werk_test_tiny.py").decode()


def test_a_wheel_is_built_once_with_its_settings_and_then_reused(index: Path) -> None:
    lines: list[str] = []
    built = build_source_wheel(_wheel(), python=Path(sys.executable), report=lines.append)
    assert built.parent.parent == source_wheel_cache()
    assert "FLAG = 'portable'" in _flag_in(built)  # the setting reached the build
    assert (built.parent / "build.json").is_file()
    assert any(line.startswith("building werk-test-tiny==1.0") for line in lines)
    for sdist in index.iterdir():  # nothing left to build from: a second call must reuse
        sdist.unlink()
    again: list[str] = []
    assert build_source_wheel(_wheel(), python=Path(sys.executable), report=again.append) == built
    assert again and again[0].startswith("reusing ")
    assert cached_wheel(_wheel("other")) is None  # other settings, another entry


def test_a_failed_build_leaves_no_cache_entry(index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINY_FAIL", "1")
    with pytest.raises(Unavailable, match=r"building werk-test-tiny==1\.0 from source failed"):
        build_source_wheel(_wheel(), python=Path(sys.executable))
    assert cached_wheel(_wheel()) is None
    assert [p.name for p in source_wheel_cache().iterdir()] == [".lock"]


def test_a_killed_build_leaves_no_entry_and_the_next_build_clears_its_leftovers(
    index: Path, tmp_path: Path
) -> None:
    code = (
        "import sys; from pathlib import Path; from werk import SourceWheel; "
        "from werk.source_wheels import build_source_wheel; "
        f"build_source_wheel(SourceWheel(name={NAME!r}, version={VERSION!r}, "
        "environment={'TINY_FLAG': 'portable'}), python=Path(sys.executable))"
    )
    env = {**os.environ, "TINY_SLOW": "60"}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    root = source_wheel_cache()
    deadline = time.monotonic() + 60
    while not list(root.glob(".building-*/build.log")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # pip is running the slow backend now
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert list(root.glob(".building-*")), "the killed build's private directory is left"
    assert cached_wheel(_wheel()) is None
    built = build_source_wheel(_wheel(), python=Path(sys.executable))
    assert built.is_file()
    assert not list(root.glob(".building-*"))


@pytest.mark.slow
def test_a_managed_environment_installs_a_source_wheel(index: Path, tmp_path: Path) -> None:
    spec = EnvironmentSpec(
        name="tiny",
        requirements=(),
        source_wheels=(_wheel(),),
        imports=("werk_test_tiny",),
    )
    steps: list[str] = []
    status = ManagedEnvironment(tmp_path / "home", "tiny").install(
        spec, progress=lambda step: steps.append(step.label)
    )
    assert status.state is EnvironmentState.READY
    assert "build (or reuse) the werk-test-tiny wheel" in steps
    assert status.distributions.get("werk-test-tiny") == VERSION
    done = subprocess.run(
        [str(status.path / "bin" / "python"), "-c", "import werk_test_tiny as t; print(t.FLAG)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "portable"
    other = EnvironmentSpec(name="tiny", requirements=(), source_wheels=(_wheel("other"),))
    assert other.digest() != spec.digest()  # other build settings: the environment is outdated


def test_a_spec_needs_a_requirement_or_a_source_wheel() -> None:
    with pytest.raises(ValueError, match="needs at least one requirement"):
        EnvironmentSpec(name="empty", requirements=())
    assert EnvironmentSpec(name="ok", requirements=(), source_wheels=(_wheel(),)).source_wheels
