"""A full and a read-only disk under the state store, the job store and the chat archives.

Real kernel errors: each test mounts a small ``tmpfs`` (``werk.testing.disk``), fills it until
the kernel answers ``ENOSPC``, or remounts it read-only (``EROFS``). Where this machine cannot
mount one the tests are skipped with the reason. What must hold: a typed error
(``InsufficientStorage``, 507, retryable; ``ReadOnlyStorage``, 503, not retryable), nothing
half-written visible, reads keep working, and everything committed before is intact once the
space is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _crash_child import commit, leftovers, payload_chunks, read_payload

from werk.chat.archive import Message, SessionStore
from werk.protocol import InsufficientStorage, JobStatus, ReadOnlyStorage
from werk.state.catalog import StateCatalog
from werk.state.jobs import JobStore
from werk.testing.disk import FilesystemUnavailable, fill, read_only, small_filesystem

SIZE = 4 * 1024 * 1024


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    try:
        with small_filesystem(tmp_path / "fs", SIZE) as mounted:
            yield mounted
    except FilesystemUnavailable as exc:
        pytest.skip(f"no small file system can be mounted here: {exc}")


def test_a_full_disk_refuses_a_state_commit_and_keeps_what_was_committed(disk: Path) -> None:
    home = disk / "home"
    catalog = StateCatalog(home)
    first_data = payload_chunks(1, 4, 64 * 1024)
    first = commit(catalog, first_data)
    filler = fill(disk)
    with pytest.raises(InsufficientStorage) as refused:
        commit(catalog, payload_chunks(2, 8, 64 * 1024), fp=1)
    assert refused.value.retryable and refused.value.http_status == 507
    assert "no space left" in refused.value.message
    assert leftovers(home) == []  # nothing half-written visible
    assert [s.id for s in catalog.list("local")] == [first.id]  # reads keep working
    assert read_payload(catalog, "local", first.id) == b"".join(first_data)
    filler.unlink()  # the space is back
    second = commit(catalog, payload_chunks(2, 8, 64 * 1024), fp=1)
    assert [s.id for s in catalog.list("local")] == [first.id, second.id]
    assert read_payload(catalog, "local", first.id) == b"".join(first_data)


def test_a_read_only_disk_refuses_a_state_commit_and_serves_reads(disk: Path) -> None:
    home = disk / "home"
    catalog = StateCatalog(home)
    first = commit(catalog, [b"kept"])
    with read_only(disk):
        with pytest.raises(ReadOnlyStorage) as refused:
            commit(catalog, [b"new"], fp=1)
        assert not refused.value.retryable and refused.value.http_status == 503
        assert [s.id for s in catalog.list("local")] == [first.id]
        assert read_payload(catalog, "local", first.id) == b"kept"
    second = commit(catalog, [b"new"], fp=1)
    assert [s.id for s in catalog.list("local")] == [first.id, second.id]


def test_a_full_disk_refuses_a_job_output_and_keeps_the_record(disk: Path) -> None:
    store = JobStore(disk / "home", clock=lambda: 1_800_000_000.0)
    record = store.create("p_a", "images.generations", {"model": "m"})
    fill(disk)
    with pytest.raises(InsufficientStorage):
        store.save_output(record.id, b"\x89PNG" * 100_000, "image/png")
    assert store.get("p_a", record.id) == record  # the record is intact and readable
    assert store.get("p_a", record.id).status is JobStatus.QUEUED


def test_a_full_disk_refuses_a_chat_archive_write_and_keeps_the_last_one(disk: Path) -> None:
    sessions = SessionStore(disk / "home")
    first = [Message(role="user", content="hello"), Message(role="assistant", content="hi")]
    longer = [*first, Message(role="user", content="x" * 200_000)]
    with sessions.open("notes", model="demo") as session:
        session.save(first, system=None)
        filler = fill(disk)
        with pytest.raises(InsufficientStorage):
            session.save(longer, system=None)
        assert sessions.read("notes").messages == first  # the previous archive, whole
        filler.unlink()
        session.save(longer, system=None)
    assert sessions.read("notes").messages == longer
