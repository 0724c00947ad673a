"""A real cgroup-limited process reports the cgroup budget, not physical RAM.

Each test creates a memory cgroup with a limit far below physical RAM, moves a *subprocess* into
it, and has that subprocess print ``MemoryManager().snapshot().host.total_bytes``. The test skips
with the precise reason where the machine does not permit it (no such hierarchy, controller not
delegated, not root, no systemd). Every cgroup created here is removed afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from werk.testing.cgroups import cgroup_dir, cgroup_mounts, own_cgroup_path

LIMIT = 512 * (1 << 20)

PROBE = r"""
import json, sys
sys.stdin.readline()  # wait until the parent has moved us into the cgroup
from werk.memory import AcceleratorSample, MemoryManager, sample_host_budget
manager = MemoryManager(accelerator_sampler=lambda: AcceleratorSample([], "not sampled"))
snap = manager.snapshot()
detail = sample_host_budget()
print(json.dumps({
    "total": snap.host.total_bytes if snap.host else None,
    "available": snap.host.available_bytes if snap.host else None,
    "source": detail.source,
    "physical": detail.physical_total_bytes,
    "pressure": snap.pressure,
    "cgroup": open("/proc/self/cgroup").read(),
}))
"""


def _run_probe(prefix: list[str], join: Path | None) -> dict[str, object]:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", PROBE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if join is not None:
            (join / "cgroup.procs").write_text(f"{proc.pid}\n")
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    result: dict[str, object] = json.loads(out)
    return result


@contextlib.contextmanager
def _child(parent: Path) -> Iterator[Path]:
    child = parent / f"werk-test-{uuid.uuid4().hex[:12]}"
    child.mkdir()
    try:
        yield child
    finally:
        with contextlib.suppress(FileNotFoundError):
            child.rmdir()
        assert not child.exists(), f"could not remove test cgroup {child}"


def _assert_budget(result: dict[str, object], child: Path | None) -> None:
    physical = psutil.virtual_memory().total
    assert physical > LIMIT
    if child is not None:
        assert child.name in str(result["cgroup"]), result["cgroup"]
    assert result["physical"] == physical
    assert result["total"] == LIMIT, result
    assert result["source"] != "physical"
    assert isinstance(result["available"], int) and 0 <= result["available"] <= LIMIT
    assert result["pressure"] in ("normal", "soft", "hard", "emergency")


def test_cgroup_v2_child_reports_its_memory_max() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a cgroup needs root here")
    mount = next((m for m in cgroup_mounts() if m.fstype == "cgroup2"), None)
    own = own_cgroup_path("")
    if mount is None or own is None:
        pytest.skip("no cgroup v2 hierarchy is mounted for this process")
    parent = cgroup_dir(mount, own)
    if parent is None:
        pytest.skip(f"this process's cgroup v2 directory {own!r} is not visible here")
    controllers = (parent / "cgroup.controllers").read_text().split()
    if "memory" not in controllers:
        pytest.skip(
            "cgroup v2 memory controller not delegated here: "
            f"{parent}/cgroup.controllers lists {controllers or 'nothing'}"
        )
    subtree = parent / "cgroup.subtree_control"
    enabled_here = False
    if "memory" not in subtree.read_text().split():
        try:
            subtree.write_text("+memory\n")
            enabled_here = True
        except OSError as exc:
            pytest.skip(
                f"cgroup v2 memory controller not delegated here: +memory in {subtree}: {exc}"
            )
    try:
        with _child(parent) as child:
            try:
                (child / "memory.max").write_text(f"{LIMIT}\n")
            except OSError as exc:
                pytest.skip(f"cannot write {child}/memory.max: {exc}")
            _assert_budget(_run_probe([], child), child)
    finally:
        if enabled_here:
            with contextlib.suppress(OSError):
                subtree.write_text("-memory\n")


def test_cgroup_v1_child_reports_its_limit_in_bytes() -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a cgroup needs root here")
    mount = next(
        (m for m in cgroup_mounts() if m.fstype == "cgroup" and "memory" in m.super_options), None
    )
    own = own_cgroup_path("memory")
    if mount is None or own is None:
        pytest.skip("no cgroup v1 memory hierarchy is mounted for this process")
    parent = cgroup_dir(mount, own)
    if parent is None:
        pytest.skip(f"this process's cgroup v1 memory directory {own!r} is not visible here")
    try:
        context = _child(parent)
        child = context.__enter__()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup v1 memory child under {parent}: {exc}")
    try:
        try:
            (child / "memory.limit_in_bytes").write_text(f"{LIMIT}\n")
        except OSError as exc:
            pytest.skip(f"cannot write {child}/memory.limit_in_bytes: {exc}")
        _assert_budget(_run_probe([], child), child)
    finally:
        context.__exit__(None, None, None)


def test_systemd_run_scope_reports_memory_max() -> None:
    systemd_run = shutil.which("systemd-run")
    if systemd_run is None:
        pytest.skip("systemd-run is not installed")
    check = subprocess.run(
        [systemd_run, "--scope", "--quiet", "-p", f"MemoryMax={LIMIT}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if check.returncode != 0:
        reason = (check.stderr.strip().splitlines() or [f"exit {check.returncode}"])[0]
        pytest.skip(f"systemd-run --scope is not usable here: {reason}")
    result = _run_probe([systemd_run, "--scope", "--quiet", "-p", f"MemoryMax={LIMIT}"], None)
    _assert_budget(result, None)
