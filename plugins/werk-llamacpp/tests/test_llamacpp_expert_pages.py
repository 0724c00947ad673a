"""CPU expert page preparation for the MoE demo model (issue 16), on the real page cache:

* the inventory finds the ``*_exps`` tensors of the generated MoE GGUF (none in a dense one);
* preparation makes the complete expert pages resident and leaves every other page of the
  file untouched (``mincore`` after dropping the file's cache);
* the deadline stops it with nothing retained; a build that may offload is skipped;
* through a real ``werk serve`` and llama-server: ``werk ps -v`` reports what it did, the
  mappings live as long as the runtime, and are gone before the file-cache release (with
  ``WERK_MODEL_CACHE_RELEASE=on`` the expert pages leave the cache after the unload, which a
  retained mapping would prevent).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    gone,
    inspection_stub,
    llama_children,
    needs_llama_server,
    wait_until,
    werk_env,
    werk_serve,
)
from werk_llamacpp.demo import create_demo_model
from werk_llamacpp.expert_pages import expert_ranges, prepare_expert_pages

from werk import InvalidRequest
from werk.memory.pages import PAGE_SIZE, resident_pages
from werk.memory.prepare import complete_pages

MiB = 1 << 20


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "moe.gguf"
    create_demo_model(path, seed=0, size="moe")
    return path


def mapped_in(pid: int, path: Path) -> int:
    total = 0
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(str(path)):
                start, end = line.split()[0].split("-")
                total += int(end, 16) - int(start, 16)
    return total


def test_the_inventory_finds_the_expert_tensors(moe: Path, tmp_path: Path) -> None:
    ranges = expert_ranges(moe)
    assert len(ranges) == 4 * 3  # layers × gate/up/down
    assert all(r.length == 8 * 512 * 256 * 2 for r in ranges)  # experts × n_ff × n_embd, F16
    dense = tmp_path / "dense.gguf"
    create_demo_model(dense, seed=0, size="tiny")
    assert expert_ranges(dense) == []
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf")
    with pytest.raises(InvalidRequest, match=r"junk\.gguf"):
        expert_ranges(junk)


@pytest.mark.anyio
async def test_only_the_expert_pages_become_resident(moe: Path) -> None:
    inventory = expert_ranges(moe)  # reading the header faults (and reads around) its pages
    drop_cache(moe)
    if resident_pages(moe).resident:
        pytest.skip("this filesystem keeps pages after POSIX_FADV_DONTNEED (tmpfs?)")
    prepared = await prepare_expert_pages(moe, [], inspection_stub(), ranges=inventory)
    assert prepared is not None
    try:
        report = prepared.report
        pages = complete_pages(inventory, moe.stat().st_size)
        expert_bytes = sum(r.length for r in pages)
        assert report.outcome == "completed"
        assert report.prefaulted_bytes == report.retained_bytes == expert_bytes
        assert report.missing_bytes == expert_bytes
        experts = sum(resident_pages(moe, r.offset, r.length).resident for r in pages)
        everything = resident_pages(moe)
        others = everything.resident - experts
        print(
            f"moe demo: {experts}/{expert_bytes // PAGE_SIZE} expert pages resident, "
            f"{others}/{everything.total - expert_bytes // PAGE_SIZE} other pages resident; "
            f"{report}"
        )
        assert experts * PAGE_SIZE == expert_bytes
        assert others == 0
        assert mapped_in(os.getpid(), moe) == expert_bytes
    finally:
        prepared.close()
    assert mapped_in(os.getpid(), moe) == 0


@pytest.mark.anyio
async def test_the_deadline_an_offloading_build_and_the_switch(moe: Path) -> None:
    stopped = await prepare_expert_pages(moe, [], inspection_stub(), deadline_seconds=0)
    assert stopped is not None and stopped.report.outcome == "stopped: deadline of 0 s"
    assert stopped.report.retained_bytes == 0 and mapped_in(os.getpid(), moe) == 0
    gpu = await prepare_expert_pages(moe, [], inspection_stub(("CUDA0: H200",)))
    assert gpu is not None
    assert gpu.report.outcome == "skipped: llama-server may offload to CUDA0: H200"
    cpu_forced = await prepare_expert_pages(moe, ["-ngl", "0"], inspection_stub(("CUDA0: H200",)))
    assert cpu_forced is not None and cpu_forced.report.outcome == "completed"
    cpu_forced.close()
    off = {"WERK_LLAMA_EXPERT_PREPARATION": "off"}
    assert await prepare_expert_pages(moe, [], inspection_stub(), environ=off) is None
    with pytest.raises(InvalidRequest, match="auto or off"):
        await prepare_expert_pages(
            moe, [], inspection_stub(), environ={"WERK_LLAMA_EXPERT_PREPARATION": "1"}
        )


@pytest.mark.slow
@needs_llama_server
def test_werk_serve_prepares_reports_and_unmaps_before_the_cache_release(tmp_path: Path) -> None:
    home = tmp_path / "werk-home"
    create_demo(home, "--size", "moe", "--id", "moe")
    gguf = home / "models" / "files" / "moe.gguf"
    drop_cache(gguf)
    pages = complete_pages(expert_ranges(gguf), gguf.stat().st_size)
    args = ("--model", "moe", "--keep-alive", "2s", "--log-level", "info")
    env = {"WERK_MODEL_CACHE_RELEASE": "on"}
    chat = {"model": "moe", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with werk_serve(home, args, env=env) as served, served.client() as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        (child,) = llama_children(served.process.pid)
        listed = client.get("/werk/v1/runtimes").json()["runtimes"][0]
        preparation = listed["preparation"]
        assert preparation["outcome"] == "completed"
        expert_bytes = sum(r.length for r in pages)  # complete pages: just under 24 MiB
        assert preparation["retained_bytes"] == expert_bytes > 23 * MiB
        assert mapped_in(served.process.pid, gguf) == expert_bytes  # Werk's retained mappings
        verbose = subprocess.run(
            [str(WERK), "ps", "-v", "--server", served.base_url],
            env=werk_env(home),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        print(verbose)
        assert "moe: page preparation: completed in" in verbose
        assert "retained 24.0 MiB" in verbose
        assert wait_until(lambda: gone(child.pid), timeout=20)
        assert wait_until(lambda: "file leases ended" in served.log(), timeout=20)
        assert mapped_in(served.process.pid, gguf) == 0
        after = sum(resident_pages(gguf, r.offset, r.length).resident for r in pages)
        assert after == 0  # released: nothing kept them mapped
        assert "released for 1 of 1 file(s)" in served.log()
