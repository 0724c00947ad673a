"""Model file-cache release on real files and the real page cache (werk.memory.filecache),
with residency measured by ``mincore`` (werk.memory.pages). A lease held by another process is
a real second Python process holding the same kind of lease another Werk process would."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk import InvalidRequest
from werk.memory.filecache import (
    CACHE_RELEASE_ENV,
    ModelFileLease,
    cache_release_enabled,
    is_wsl,
)
from werk.memory.pages import PAGE_SIZE, resident_pages

SIZE = 4 << 20


def cached_file(path: Path) -> Path:
    """A 4 MiB file whose pages are all in the page cache (written, synced, read back)."""
    path.write_bytes(os.urandom(SIZE))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # clean pages: only clean pages can be dropped
    finally:
        os.close(fd)
    path.read_bytes()
    return path


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = cached_file(tmp_path / "model.gguf")
    if resident_pages(path).fraction < 0.99:
        pytest.skip("the page cache does not keep a just-read file here")
    probe = cached_file(tmp_path / "probe.bin")
    fd = os.open(probe, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if resident_pages(probe).resident:
        pytest.skip(f"{tmp_path} keeps pages after POSIX_FADV_DONTNEED (tmpfs?)")
    return path


def test_modes() -> None:
    assert cache_release_enabled({}, wsl=False) is False  # auto off Linux-on-WSL
    assert cache_release_enabled({}, wsl=True) is True
    assert cache_release_enabled({CACHE_RELEASE_ENV: "auto"}, wsl=True) is True
    assert cache_release_enabled({CACHE_RELEASE_ENV: "ON"}, wsl=False) is True
    assert cache_release_enabled({CACHE_RELEASE_ENV: "off"}, wsl=True) is False
    with pytest.raises(InvalidRequest, match="auto, on or off"):
        cache_release_enabled({CACHE_RELEASE_ENV: "yes"})


def test_wsl_is_recognised_by_its_kernel(tmp_path: Path) -> None:
    release = tmp_path / "osrelease"
    release.write_text("5.15.153.1-microsoft-standard-WSL2\n")
    assert is_wsl(str(release), environ={})
    release.write_text("6.8.0-45-generic\n")
    assert not is_wsl(str(release), environ={})
    assert is_wsl(str(release), environ={"WSL_DISTRO_NAME": "Ubuntu"})
    assert not is_wsl(str(tmp_path / "absent"), environ={})


def test_residency_is_measured_per_page(tmp_path: Path, model: Path) -> None:
    whole = resident_pages(model)
    assert whole.total == SIZE // PAGE_SIZE and whole.resident == whole.total
    part = resident_pages(model, PAGE_SIZE, 2 * PAGE_SIZE)
    assert part.total == 2 and part.resident == 2
    with pytest.raises(ValueError, match="page size"):
        resident_pages(model, 1)
    with pytest.raises(ValueError, match="outside"):
        resident_pages(model, 0, SIZE + 1)


def test_release_on_drops_the_pages_and_off_keeps_them(model: Path) -> None:
    kept = ModelFileLease.acquire([model])
    assert kept.paths == [str(model)]
    [result] = kept.release(drop_cache=False)
    assert result.outcome == "kept: release off"
    assert resident_pages(model).fraction == 1.0
    lease = ModelFileLease.acquire([model])
    [result] = lease.release(drop_cache=True)
    assert result.outcome == "released"
    after = resident_pages(model)
    print(f"resident after release: {after.resident}/{after.total} pages")
    assert after.resident == 0
    assert lease.release(drop_cache=True) == []  # once


@pytest.fixture
def other_werk(model: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding a lease on ``model`` (what another Werk process does)."""
    code = (
        "import sys; from pathlib import Path; from werk.memory.filecache import ModelFileLease\n"
        "lease = ModelFileLease.acquire([Path(sys.argv[1])]); print(len(lease.paths), flush=True)\n"
        "sys.stdin.readline()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(model)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
    try:
        yield proc
    finally:
        proc.communicate("done\n", timeout=30)


def warm(path: Path) -> None:
    """Read ``path`` again right before a release that must keep its pages: a machine under
    memory pressure (a cgroup near its limit: CI saw half of a just-read file evicted) may
    reclaim clean pages at any time, and only a drop *by the release* may fail the test."""
    path.read_bytes()
    assert resident_pages(path).fraction == 1.0


def test_a_lease_held_elsewhere_keeps_the_pages(model: Path, other_werk: object) -> None:
    lease = ModelFileLease.acquire([model])
    warm(model)
    [result] = lease.release(drop_cache=True)
    assert result.outcome == "kept: leased elsewhere"
    assert resident_pages(model).fraction == 1.0


def test_a_second_runtime_on_the_same_file_keeps_the_pages(model: Path) -> None:
    first, second = ModelFileLease.acquire([model]), ModelFileLease.acquire([model])
    warm(model)
    assert [r.outcome for r in first.release(drop_cache=True)] == ["kept: leased elsewhere"]
    assert resident_pages(model).fraction == 1.0
    assert [r.outcome for r in second.release(drop_cache=True)] == ["released"]
    assert resident_pages(model).resident == 0


def test_a_changed_file_is_not_released(model: Path) -> None:
    lease = ModelFileLease.acquire([model])
    replacement = model.with_suffix(".new")
    cached_file(replacement)
    replacement.replace(model)  # another file now has the name
    warm(model)
    [result] = lease.release(drop_cache=True)
    assert result.outcome == "kept: changed"
    assert resident_pages(model).fraction == 1.0


def test_a_busy_lease_leaves_the_file_unleased_and_never_released(model: Path) -> None:
    holder = os.open(model, os.O_RDONLY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)  # a release in progress elsewhere
        lease = ModelFileLease.acquire([model])
        assert lease.paths == []
    finally:
        os.close(holder)
    warm(model)
    [result] = lease.release(drop_cache=True)
    assert result.outcome == "kept: not leased (lease busy)"
    assert resident_pages(model).fraction == 1.0


def test_a_directory_leases_its_regular_files(tmp_path: Path, model: Path) -> None:
    directory = tmp_path / "weights"
    directory.mkdir()
    shard = cached_file(directory / "model-00001.safetensors")
    (directory / "config.json").write_text("{}")
    lease = ModelFileLease.acquire([directory, tmp_path / "absent.gguf"])
    assert sorted(lease.paths) == sorted([str(directory / "config.json"), str(shard)])
    outcomes = {Path(r.path).name: r.outcome for r in lease.release(drop_cache=True)}
    assert outcomes == {"config.json": "released", "model-00001.safetensors": "released"}
    assert resident_pages(shard).resident == 0
