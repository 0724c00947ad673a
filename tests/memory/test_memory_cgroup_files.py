"""The cgroup reader against a fake /proc and cgroup tree (v2, v1, namespaces, bad files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from werk.memory.cgroup import CgroupReadError, read_cgroup_budget

MiB = 1 << 20


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "cg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _proc(tmp_path: Path, cgroup: str, mounts: list[str]) -> dict[str, str]:
    (tmp_path / "cgroup").write_text(cgroup)
    (tmp_path / "mountinfo").write_text("\n".join(mounts) + "\n")
    return {"proc_cgroup": str(tmp_path / "cgroup"), "mountinfo": str(tmp_path / "mountinfo")}


def _mount(mid: int, root: str, point: Path, fstype: str, sopts: str) -> str:
    escaped = str(point).replace(" ", "\\040")
    return f"{mid} 1 0:{mid} {root} {escaped} rw,relatime - {fstype} {fstype} {sopts}"


def test_v2_walks_up_and_takes_the_minimum(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "a/memory.max": f"{1024 * MiB}\n",
            "a/memory.current": f"{300 * MiB}\n",
            "a/memory.stat": "anon 1\ninactive_file 0\n",
            "a/b/memory.max": "max\n",
            "a/b/memory.current": f"{200 * MiB}\n",
            "a/b/c/memory.max": f"{2048 * MiB}\n",
            "a/b/c/memory.current": f"{150 * MiB}\n",
            "a/b/c/memory.stat": f"anon 5\ninactive_file {50 * MiB}\n",
        },
    )
    kw = _proc(tmp_path, "0::/a/b/c\n", [_mount(30, "/", root, "cgroup2", "rw")])
    budget = read_cgroup_budget(**kw)
    assert budget is not None and budget.version == 2
    assert budget.limit_bytes == 1024 * MiB and budget.path.endswith("/a")
    assert budget.usage_bytes == 300 * MiB
    # headroom: min(1024-300, 2048-(150-50)) MiB
    assert budget.headroom_bytes == 724 * MiB


@pytest.mark.parametrize("version", [1, 2])
def test_mapped_and_dirty_file_cache_count_as_used(tmp_path: Path, version: int) -> None:
    """Reclaimable = active + inactive file cache - mapped - dirty - writeback: a model file a
    runtime maps is used memory even on the inactive list; clean unmapped cache is not."""
    prefix = "total_" if version == 1 else ""
    names = (
        ("active_file", "inactive_file", "mapped_file", "dirty", "writeback")
        if version == 1
        else ("active_file", "inactive_file", "file_mapped", "file_dirty", "file_writeback")
    )
    counts = (100, 700, 650, 20, 10)  # MiB
    stat = "".join(f"{prefix}{n} {c * MiB}\n" for n, c in zip(names, counts, strict=True))
    files = (
        {"memory.max": f"{2048 * MiB}\n", "memory.current": f"{1200 * MiB}\n"}
        if version == 2
        else {
            "memory.limit_in_bytes": f"{2048 * MiB}\n",
            "memory.usage_in_bytes": f"{1200 * MiB}\n",
        }
    )
    root = _tree(tmp_path, {**files, "memory.stat": stat})
    if version == 2:
        kw = _proc(tmp_path, "0::/\n", [_mount(30, "/", root, "cgroup2", "rw")])
    else:
        kw = _proc(tmp_path, "5:memory:/\n", [_mount(31, "/", root, "cgroup", "rw,memory")])
    budget = read_cgroup_budget(**kw)
    assert budget is not None and budget.version == version
    # reclaimable = 100 + 700 - 650 - 20 - 10 = 120 MiB; the mapped 650 MiB stay counted
    assert budget.usage_bytes == (1200 - 120) * MiB
    assert budget.headroom_bytes == (2048 - 1080) * MiB


def test_v2_unlimited_everywhere_is_none(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"x/memory.max": "max\n", "x/memory.current": "5\n"})
    kw = _proc(tmp_path, "0::/x\n", [_mount(30, "/", root, "cgroup2", "rw")])
    assert read_cgroup_budget(**kw) is None


def test_namespace_root_maps_the_path(tmp_path: Path) -> None:
    """Inside a cgroup namespace the mount's root is the process's own subtree."""
    root = _tree(tmp_path, {"memory.max": f"{64 * MiB}\n", "memory.current": f"{MiB}\n"})
    kw = _proc(tmp_path, "0::/ns/job\n", [_mount(30, "/ns/job", root, "cgroup2", "rw")])
    budget = read_cgroup_budget(**kw)
    assert budget is not None and budget.limit_bytes == 64 * MiB


def test_invisible_cgroup_is_none(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"memory.max": "1\n", "memory.current": "1\n"})
    kw = _proc(tmp_path, "0::/elsewhere\n", [_mount(30, "/mine", root, "cgroup2", "rw")])
    assert read_cgroup_budget(**kw) is None


def test_hybrid_host_falls_back_to_v1(tmp_path: Path) -> None:
    unified = _tree(tmp_path, {"job/cgroup.procs": ""})  # v2 without the memory controller
    v1 = tmp_path / "v1 mem"
    (v1 / "job").mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    (v1 / "memory.usage_in_bytes").write_text(f"{4096 * MiB}\n")
    (v1 / "job/memory.limit_in_bytes").write_text(f"{512 * MiB}\n")
    (v1 / "job/memory.usage_in_bytes").write_text(f"{100 * MiB}\n")
    (v1 / "job/memory.stat").write_text(f"cache 1\ntotal_inactive_file {20 * MiB}\n")
    kw = _proc(
        tmp_path,
        "5:memory:/job\n4:cpu,cpuacct:/job\n0::/job\n",
        [_mount(30, "/", unified, "cgroup2", "rw"), _mount(31, "/", v1, "cgroup", "rw,memory")],
    )
    budget = read_cgroup_budget(**kw)
    assert budget is not None and budget.version == 1
    assert (budget.limit_bytes, budget.usage_bytes, budget.headroom_bytes) == (
        512 * MiB,
        80 * MiB,
        432 * MiB,
    )


def test_no_proc_file_or_no_mount_is_none(tmp_path: Path) -> None:
    assert read_cgroup_budget(proc_cgroup=str(tmp_path / "missing")) is None
    kw = _proc(tmp_path, "0::/\n", [])
    assert read_cgroup_budget(**kw) is None


@pytest.mark.parametrize(
    ("files", "match"),
    [
        ({"memory.max": "lots\n", "memory.current": "1\n"}, "integer"),
        ({"memory.max": "-5\n", "memory.current": "1\n"}, "negative"),
        (
            {"memory.max": "100\n", "memory.current": "1\n", "memory.stat": "inactive_file x\n"},
            "inactive_file",
        ),
    ],
)
def test_malformed_files_fail_closed(tmp_path: Path, files: dict[str, str], match: str) -> None:
    root = _tree(tmp_path, files)
    kw = _proc(tmp_path, "0::/\n", [_mount(30, "/", root, "cgroup2", "rw")])
    with pytest.raises(CgroupReadError, match=match):
        read_cgroup_budget(**kw)


def test_malformed_membership_fails_closed(tmp_path: Path) -> None:
    kw = _proc(tmp_path, "garbage\n", [])
    with pytest.raises(CgroupReadError, match="malformed"):
        read_cgroup_budget(**kw)
