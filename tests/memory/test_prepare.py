"""Page preparation on a real file and the real page cache (werk.memory.prepare): only the
complete pages inside the chosen ranges become resident (``mincore``) and stay mapped
(``/proc/self/maps``); the deadline, memory pressure, a cancellation and an error each stop it
with every mapping dropped."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from werk.memory import prepare as prepare_module
from werk.memory.pages import PAGE_SIZE, resident_pages
from werk.memory.prepare import PageRange, complete_pages, host_budget, prepare_pages
from werk.protocol import HostMemory

pytestmark = pytest.mark.skipif(os.uname().sysname != "Linux", reason="Linux page cache")

P = PAGE_SIZE
# An "expert" range that starts and ends inside pages, between two dense "tensors".
EXPERTS = PageRange(3 * P + 100, 40 * P)  # complete pages 4 .. 42 (39 pages)
SIZE = 64 * P


def always(_remaining: int) -> str | None:
    return None


def dropped_file(path: Path) -> Path:
    path.write_bytes(os.urandom(SIZE))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return path


@pytest.fixture
def model(tmp_path: Path) -> Iterator[Path]:
    path = dropped_file(tmp_path / "moe.gguf")
    if resident_pages(path).resident:
        pytest.skip(f"{tmp_path} keeps pages after POSIX_FADV_DONTNEED (tmpfs?)")
    yield path


def mapped_bytes(path: Path) -> int:
    total = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            if line.rstrip().endswith(str(path)):
                start, end = line.split()[0].split("-")
                total += int(end, 16) - int(start, 16)
    return total


def test_complete_pages_are_rounded_inwards_clipped_and_merged() -> None:
    assert complete_pages([EXPERTS], SIZE) == [PageRange(4 * P, 39 * P)]
    assert complete_pages([PageRange(10, P)], SIZE) == []  # no complete page
    assert complete_pages([PageRange(0, 2 * P), PageRange(2 * P, P)], SIZE) == [PageRange(0, 3 * P)]
    assert complete_pages([PageRange(60 * P, 10 * P)], SIZE) == [PageRange(60 * P, 4 * P)]


def test_only_the_complete_expert_pages_become_resident_and_stay_mapped(model: Path) -> None:
    prepared = prepare_pages(
        model, [EXPERTS], deadline_seconds=30, budget=always, chunk_bytes=8 * P
    )
    report = prepared.report
    assert report.outcome == "completed"
    expert_bytes = 39 * P
    assert report.checked_bytes == report.prefaulted_bytes == expert_bytes
    assert report.missing_bytes == expert_bytes  # the cache was dropped first
    assert report.retained_bytes == prepared.retained_bytes == expert_bytes
    assert resident_pages(model, 4 * P, 39 * P).resident == 39
    before = resident_pages(model, 0, 4 * P)  # the boundary page 3 and the dense pages before
    after = resident_pages(model, 43 * P, SIZE - 43 * P)
    print(f"expert pages 39/39 resident; others {before.resident}+{after.resident} resident")
    assert before.resident == 0 and after.resident == 0  # (no readahead: mapped, not read)
    assert mapped_bytes(model) == expert_bytes
    prepared.close()
    prepared.close()
    assert mapped_bytes(model) == 0 and prepared.retained_bytes == 0


def test_already_resident_pages_are_not_missing(model: Path) -> None:
    model.read_bytes()
    prepared = prepare_pages(model, [EXPERTS], deadline_seconds=30, budget=always)
    assert prepared.report.outcome == "completed" and prepared.report.missing_bytes == 0
    prepared.close()


class SteppingClock:
    """Advances one second per reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_deadline_stops_between_chunks_and_drops_every_mapping(model: Path) -> None:
    prepared = prepare_pages(
        model,
        [EXPERTS],
        deadline_seconds=3.5,
        budget=always,
        chunk_bytes=4 * P,
        workers=1,
        clock=SteppingClock(),
    )
    report = prepared.report
    assert report.outcome == "stopped: deadline of 3.5 s"
    assert 0 < report.prefaulted_bytes < 39 * P  # some chunks ran before it
    assert report.retained_bytes == 0 and mapped_bytes(model) == 0


def test_memory_pressure_stops_it_and_drops_every_mapping(model: Path) -> None:
    calls = []

    def budget(remaining: int) -> str | None:
        calls.append(remaining)
        return "host at 90 %" if len(calls) > 3 else None

    prepared = prepare_pages(
        model, [EXPERTS], deadline_seconds=30, budget=budget, chunk_bytes=4 * P, workers=1
    )
    report = prepared.report
    assert report.outcome == "stopped: memory pressure (host at 90 %)"
    assert report.prefaulted_bytes == 2 * 4 * P  # two chunks, then pressure
    assert calls[0] == 39 * P and calls[1:3] == [39 * P, 35 * P]  # checked first, then per chunk
    assert report.retained_bytes == 0 and mapped_bytes(model) == 0


def test_the_budget_is_checked_before_anything_is_touched(model: Path) -> None:
    prepared = prepare_pages(
        model, [EXPERTS], deadline_seconds=30, budget=lambda _: "cgroup at 80 %"
    )
    assert prepared.report.outcome == "skipped: cgroup at 80 %"
    assert prepared.report.checked_bytes == 0
    assert resident_pages(model).resident == 0 and mapped_bytes(model) == 0


def test_a_cancellation_and_an_error_stop_it(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled = threading.Event()
    cancelled.set()
    prepared = prepare_pages(model, [EXPERTS], deadline_seconds=30, budget=always, cancel=cancelled)
    assert prepared.report.outcome == "stopped: cancelled"
    monkeypatch.setattr(prepare_module, "MADV_POPULATE_READ", 12345)  # EINVAL from the kernel
    prepared = prepare_pages(model, [EXPERTS], deadline_seconds=30, budget=always)
    assert prepared.report.outcome.startswith("stopped: OSError")
    assert "MADV_POPULATE_READ" in prepared.report.outcome
    assert prepared.report.retained_bytes == 0 and mapped_bytes(model) == 0


def test_two_workers_prepare_every_chunk(model: Path) -> None:
    prepared = prepare_pages(
        model, [PageRange(0, SIZE)], deadline_seconds=30, budget=always, chunk_bytes=2 * P
    )
    assert prepared.report.outcome == "completed"
    assert resident_pages(model).resident == SIZE // P
    assert mapped_bytes(model) == SIZE
    prepared.close()


def test_the_host_budget_keeps_preparation_below_the_soft_threshold() -> None:
    host = HostMemory(total_bytes=100, used_bytes=70, available_bytes=30)
    check = host_budget(lambda: host)
    assert check(4) is None  # 74 %
    assert check(5) is not None and "soft threshold" in str(check(5))  # 75 %

    def failing() -> HostMemory:
        raise OSError("no /proc")

    assert "could not be sampled" in str(host_budget(failing)(1))


@pytest.mark.anyio
async def test_a_cancelled_caller_waits_for_the_workers_and_drops_the_mappings(
    model: Path,
) -> None:
    import anyio

    from werk.memory.prepare import prepare_pages_async

    started = threading.Event()

    def slow(remaining: int) -> str | None:
        started.set()
        time.sleep(0.05)  # per chunk: the cancellation arrives mid-way
        return None

    with anyio.move_on_after(0.2) as scope:
        await prepare_pages_async(
            model, [EXPERTS], deadline_seconds=30, budget=slow, chunk_bytes=P, workers=1
        )
    assert scope.cancelled_caught and started.is_set()
    assert not [t for t in threading.enumerate() if t.name.startswith("werk-prepare")]
    assert mapped_bytes(model) == 0
