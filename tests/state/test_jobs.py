"""``werk.state.jobs.JobStore``: durable, principal-private job records and outputs."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from werk.protocol import JobDeleted, JobStatus, NotFound
from werk.state import jobs as jobs_module
from werk.state.jobs import INTERRUPTED, JobStore

A, B = "p_alpha", "p_bravo"


def _store(home: Path) -> JobStore:
    return JobStore(home, clock=lambda: 1_800_000_000.0)


def test_a_record_is_private_to_its_principal_and_files_are_owner_only(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.create(A, "audio.speech", {"model": "m", "input": "hi"})
    assert record.status is JobStatus.QUEUED and record.request == {"model": "m", "input": "hi"}
    assert store.get(A, record.id) == record
    with pytest.raises(NotFound):
        store.get(B, record.id)
    assert store.records(B) == [] and store.records(A) == [record]
    for bad in ("../x", "job_", "job_a/b", "x" * 80):
        with pytest.raises(NotFound):
            store.get(A, bad)
    path = tmp_path / "jobs" / f"{record.id}.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "jobs").stat().st_mode) == 0o700


def test_outputs_are_downloadable_only_by_the_jobs_principal(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.create(A, "audio.speech", {})
    output = store.save_output(record.id, b"RIFF....", "audio/wav")
    store.update(record.id, status=JobStatus.COMPLETED, output=output)
    assert store.output(A, output.id) == (b"RIFF....", "audio/wav")
    with pytest.raises(NotFound):
        store.output(B, output.id)
    with pytest.raises(NotFound):
        store.output(A, "out_missing")


def test_a_finished_record_is_created_with_its_output_in_one_step(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.create_finished(A, "images.generations", {"model": "m"}, b"PNG", "image/png")
    assert record.status is JobStatus.COMPLETED and record.output is not None
    assert store.get(A, record.id) == record
    assert store.output(A, record.output.id) == (b"PNG", "image/png")
    with pytest.raises(NotFound):
        store.output(B, record.output.id)


def test_cancel_is_immediate_when_queued_and_requested_when_running(tmp_path: Path) -> None:
    store = _store(tmp_path)
    queued = store.create(A, "audio.speech", {})
    assert store.cancel(A, queued.id).status is JobStatus.CANCELLED
    running = store.create(A, "audio.speech", {})
    store.update(running.id, status=JobStatus.RUNNING)
    requested = store.cancel(A, running.id)
    assert requested.status is JobStatus.RUNNING and requested.cancel_requested
    with pytest.raises(NotFound):
        store.cancel(B, running.id)


def test_cancel_of_a_finished_job_deletes_it_with_its_output(tmp_path: Path) -> None:
    """``DELETE /v1/jobs/{id}`` of a finished job removes it (it used to answer 200 and stay);
    only its owner can, and a second delete finds nothing."""
    store = _store(tmp_path)
    done = store.create_finished(A, "images.generations", {}, b"PNG", "image/png")
    assert done.output is not None
    with pytest.raises(NotFound):
        store.cancel(B, done.id)
    assert store.cancel(A, done.id) == JobDeleted(id=done.id)
    with pytest.raises(NotFound):
        store.get(A, done.id)
    with pytest.raises(NotFound):
        store.output(A, done.output.id)
    with pytest.raises(NotFound):
        store.cancel(A, done.id)
    for status in (JobStatus.FAILED, JobStatus.CANCELLED):
        ended = store.update(store.create(A, "k", {}).id, status=status)
        assert isinstance(store.cancel(A, ended.id), JobDeleted)
        assert store.records(A) == []


def test_recovery_fails_unfinished_jobs_and_keeps_finished_ones(tmp_path: Path) -> None:
    store = _store(tmp_path)
    done = store.update(store.create(A, "k", {}).id, status=JobStatus.COMPLETED)
    running = store.update(store.create(A, "k", {}).id, status=JobStatus.RUNNING)
    queued = store.create(B, "k", {})
    (tmp_path / "jobs" / ".tmp-deadbeef").write_bytes(b"half a record")  # a crashed write
    fresh = _store(tmp_path)  # a new server
    assert sorted(fresh.recover()) == sorted([running.id, queued.id])
    assert fresh.get(A, done.id) == done
    for principal, job in ((A, running), (B, queued)):
        failed = fresh.get(principal, job.id)
        assert failed.status is JobStatus.FAILED
        assert failed.error is not None and failed.error.message == INTERRUPTED
    assert not (tmp_path / "jobs" / ".tmp-deadbeef").exists()


def test_a_corrupt_record_is_never_served(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.create(A, "k", {})
    path = tmp_path / "jobs" / f"{record.id}.json"
    path.write_bytes(b"{not json")
    with pytest.raises(NotFound):
        store.get(A, record.id)
    assert store.records(A) == []
    assert path.exists()  # left for inspection, not silently deleted


def test_only_the_newest_terminal_records_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_module, "MAX_TERMINAL_JOBS", 3)
    now = [1_800_000_000.0]
    store = JobStore(tmp_path, clock=lambda: now[0])
    finished = []
    for _ in range(4):
        now[0] += 1
        record = store.create(A, "k", {})
        output = store.save_output(record.id, b"x", "text/plain")
        finished.append(store.update(record.id, status=JobStatus.COMPLETED, output=output))
    now[0] += 1
    store.create(A, "k", {})  # creating prunes the oldest terminal ones beyond the bound
    kept = {r.id for r in store.records(A)}
    assert finished[0].id not in kept and finished[1].id not in kept
    assert {finished[2].id, finished[3].id} <= kept
    outputs = set(os.listdir(tmp_path / "jobs" / "outputs"))
    assert finished[0].output is not None and finished[0].output.id not in outputs
