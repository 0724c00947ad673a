"""Hostile stores: links, wrong types, corruption, permissions, bounds, other principals,
injected disk errors, and the proof that reads never change a byte on disk."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _crash_child import (
    P_OTHER,
    commit,
    fingerprint,
    leftovers,
    payload_chunks,
    read_payload,
    store,
    tree_digest,
)

from werk import _fs
from werk.protocol.errors import ErrorCode, InsufficientStorage, NotFound, PayloadTooLarge
from werk.protocol.states import PruneFilter, PruneRequest, Tier
from werk.state.catalog import StateCatalog, StorageError, StoredState


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def faults() -> Iterator[Callable[[Callable[[str], None]], None]]:
    def install(hook: Callable[[str], None]) -> None:
        _fs._FAULTS = hook

    yield install
    _fs._FAULTS = None


def _two_states(home: Path) -> tuple[StateCatalog, StoredState, StoredState]:
    catalog = StateCatalog(home)
    return catalog, commit(catalog, [b"first"]), commit(catalog, [b"second"], fp=2)


def _omitted_everywhere(catalog: StateCatalog, state: StoredState) -> None:
    assert state.id not in [s.id for s in catalog.list("local")]
    assert state.id not in [s.id for s in catalog.find("local", fingerprint=state.fingerprint)]
    with pytest.raises(NotFound):
        catalog.get("local", state.id)
    with pytest.raises(NotFound):
        catalog.open_payload("local", state.id)
    preview = catalog.prune_preview("local", PruneRequest(all=True, confirm="all"))
    assert state.id not in preview.selected


def _reads_leave_no_trace(home: Path, catalog: StateCatalog, state: StoredState) -> None:
    before = tree_digest(home)
    _omitted_everywhere(catalog, state)
    assert tree_digest(home) == before


# -- links and wrong types ---------------------------------------------------------------------


def test_symlinked_state_dir_is_never_followed(tmp_path: Path, home: Path) -> None:
    catalog, keep, _ = _two_states(home)
    # A complete, valid state in another store: only the link makes it unacceptable.
    other = StateCatalog(tmp_path / "other")
    foreign = commit(other, [b"foreign"])
    target = store(tmp_path / "other") / "p_local" / foreign.id
    link = store(home) / "p_local" / foreign.id
    link.symlink_to(target, target_is_directory=True)
    _reads_leave_no_trace(home, catalog, foreign)
    report = catalog.reconcile()
    assert report.unsafe_unlinked == 1 and not os.path.lexists(link)
    assert read_payload(other, "local", foreign.id) == b"foreign"  # the target is untouched
    assert read_payload(catalog, "local", keep.id) == b"first"


def test_symlinked_payload_is_rejected_and_quarantined(tmp_path: Path, home: Path) -> None:
    catalog, victim, keep = _two_states(home)
    payload = store(home) / "p_local" / victim.id / "payload.bin"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"first")  # same size and hash: only the link is wrong
    outside.chmod(0o600)
    payload.unlink()
    payload.symlink_to(outside)
    _reads_leave_no_trace(home, catalog, victim)
    assert catalog.reconcile().quarantined == 1
    assert outside.read_bytes() == b"first"
    assert [s.id for s in catalog.list("local")] == [keep.id]


def test_symlinked_principal_dir_is_never_followed(tmp_path: Path, home: Path) -> None:
    other = StateCatalog(tmp_path / "other")
    foreign = commit(other, [b"foreign"])
    catalog = StateCatalog(home)
    commit(catalog, [b"x"], principal=P_OTHER)  # creates the store
    (store(home) / "p_local").symlink_to(store(tmp_path / "other") / "p_local")
    _reads_leave_no_trace(home, catalog, foreign)
    assert catalog.list("local") == []
    mine = commit(catalog, [b"mine"])  # the mutation unlinks the link and makes a real dir
    assert not (store(home) / "p_local").is_symlink()
    assert [s.id for s in catalog.list("local")] == [mine.id]
    assert read_payload(other, "local", foreign.id) == b"foreign"


def test_regular_files_where_directories_belong(home: Path) -> None:
    catalog, keep, _ = _two_states(home)
    pdir = store(home) / "p_local"
    (pdir / "st_plainfile1").write_bytes(b"not a dir")
    (store(home) / ".quarantine").write_bytes(b"not a dir")
    (store(home) / ("p_" + "cd" * 32)).write_bytes(b"not a dir")
    before = tree_digest(home)
    assert len(catalog.list("local")) == 2 and catalog.list("p_" + "cd" * 32) == []
    with pytest.raises(NotFound):
        catalog.get("local", "st_plainfile1")
    assert tree_digest(home) == before
    report = catalog.reconcile()
    assert report.unsafe_unlinked == 3
    assert not (pdir / "st_plainfile1").exists()
    assert read_payload(catalog, "local", keep.id) == b"first"
    # and a principal directory that is a regular file from the start
    shutil.rmtree(pdir)
    pdir.write_bytes(b"")
    assert catalog.list("local") == []
    fresh = commit(catalog, [b"again"])
    assert [s.id for s in catalog.list("local")] == [fresh.id]


# -- corruption ----------------------------------------------------------------------------------


def test_corrupted_payload_byte(home: Path) -> None:
    catalog, victim, keep = _two_states(home)
    payload = store(home) / "p_local" / victim.id / "payload.bin"
    with payload.open("r+b") as f:
        f.write(b"F")  # same size, different bytes
    with pytest.raises(NotFound):
        catalog.open_payload("local", victim.id)
    # Reads do not hash whole payloads, so it still lists until the next mutation ...
    report = StateCatalog(home).reconcile()  # ... of a catalog that never loaded it: kept
    assert report.quarantined == 0
    commit(catalog, [b"third"], fp=3)  # the next mutation of the refusing catalog
    assert victim.id not in [s.id for s in catalog.list("local")]
    assert len(list((store(home) / ".quarantine").iterdir())) == 1
    assert read_payload(catalog, "local", keep.id) == b"second"


@pytest.mark.parametrize(
    "damage",
    [
        "truncated_metadata",
        "metadata_hash_mismatch",
        "unknown_field",
        "wrong_schema",
        "missing_payload",
        "missing_hash",
        "payload_size",
        "unexpected_file",
        "moved_from_other_principal",
        "garbage_last_accessed",
    ],
)
def test_malformed_state_is_omitted_then_quarantined(home: Path, damage: str) -> None:
    catalog, victim, keep = _two_states(home)
    sdir = store(home) / "p_local" / victim.id
    meta = (sdir / "metadata.json").read_bytes()

    def write(name: str, data: bytes) -> None:
        (sdir / name).write_bytes(data)
        (sdir / name).chmod(0o600)

    def rewrite_metadata(data: bytes) -> None:
        write("metadata.json", data)
        write("metadata.sha256", hashlib.sha256(data).hexdigest().encode() + b"\n")

    if damage == "truncated_metadata":
        write("metadata.json", meta[: len(meta) // 2])
    elif damage == "metadata_hash_mismatch":
        write("metadata.json", meta.replace(b'"demo"', b'"DEMO"'))
    elif damage == "unknown_field":
        rewrite_metadata(meta[:-1] + b',"extra":1}')
    elif damage == "wrong_schema":
        rewrite_metadata(meta.replace(b'"schema":1', b'"schema":2'))
    elif damage == "missing_payload":
        (sdir / "payload.bin").unlink()
    elif damage == "missing_hash":
        (sdir / "metadata.sha256").unlink()
    elif damage == "payload_size":
        write("payload.bin", b"first+")
    elif damage == "unexpected_file":
        write("extra.bin", b"")
    elif damage == "moved_from_other_principal":
        # The victim's metadata names `local`; move it under another principal.
        other = store(home) / ("p_" + "ab" * 32)
        other.mkdir(mode=0o700)
        sdir.rename(other / victim.id)
        assert StateCatalog(home).list(P_OTHER) == []
        with pytest.raises(NotFound):
            catalog.get(P_OTHER, victim.id)
        assert catalog.reconcile().quarantined == 1
        return
    elif damage == "garbage_last_accessed":
        write("last-accessed", b"yesterday")
    _reads_leave_no_trace(home, catalog, victim)
    assert catalog.reconcile().quarantined == 1
    assert not sdir.exists()
    assert [s.id for s in catalog.list("local")] == [keep.id]


@pytest.mark.parametrize(
    ("where", "mode"),
    [("payload.bin", 0o644), ("metadata.json", 0o640), ("state", 0o755), ("principal", 0o755)],
)
def test_wrong_permissions_fail_closed(home: Path, where: str, mode: int) -> None:
    """Policy: a data directory not exactly 0700 or a file not exactly 0600 is omitted from
    reads and quarantined by the next mutation (never silently repaired)."""
    catalog, victim, keep = _two_states(home)
    pdir = store(home) / "p_local"
    target = {"state": pdir / victim.id, "principal": pdir}.get(where, pdir / victim.id / where)
    target.chmod(mode)
    _reads_leave_no_trace(home, catalog, victim)
    assert catalog.reconcile().quarantined == 1
    if where == "principal":
        assert catalog.list("local") == []  # the whole directory went to quarantine
        assert len(list((store(home) / ".quarantine").iterdir())) == 1
    else:
        assert [s.id for s in catalog.list("local")] == [keep.id]
    fresh = commit(catalog, [b"new"])
    assert fresh.id in [s.id for s in catalog.list("local")]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
@pytest.mark.parametrize("where", ["payload.bin", "state", "principal"])
def test_foreign_owner_fails_closed(home: Path, where: str) -> None:
    catalog, victim, keep = _two_states(home)
    pdir = store(home) / "p_local"
    target = {"state": pdir / victim.id, "principal": pdir}.get(where, pdir / victim.id / where)
    os.chown(target, 65534, 65534, follow_symlinks=False)
    _reads_leave_no_trace(home, catalog, victim)
    assert catalog.reconcile().quarantined == 1
    assert victim.id not in [s.id for s in catalog.list("local")]
    assert (keep.id in [s.id for s in catalog.list("local")]) is (where != "principal")


# -- bounds and principals ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["iterable", "path", "single"])
def test_payload_over_the_bound(home: Path, tmp_path: Path, kind: str) -> None:
    catalog = StateCatalog(home, max_payload_bytes=1000)
    keep = commit(catalog, [b"k" * 1000])  # exactly at the bound is fine
    source: object = iter([b"a" * 400] * 3)
    if kind == "path":
        source = tmp_path / "big.bin"
        (tmp_path / "big.bin").write_bytes(b"b" * 1001)
    elif kind == "single":
        source = b"c" * 1001
    with pytest.raises(PayloadTooLarge) as info:
        catalog.commit(
            "local",
            envelope=keep.envelope,
            model="demo",
            backend="test",
            tier=Tier.DISK,
            fingerprint=fingerprint(0),
            payload=source,  # type: ignore[arg-type]
            ttl_seconds=None,
            pinned=False,
        )
    assert info.value.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert leftovers(home) == []
    assert [s.id for s in catalog.list("local")] == [keep.id]


def test_principals_never_see_each_other(home: Path) -> None:
    catalog = StateCatalog(home)
    mine = commit(catalog, [b"local data"], fp=7)
    theirs = commit(catalog, [b"other data"], principal=P_OTHER, fp=7)
    assert [s.id for s in catalog.list(P_OTHER)] == [theirs.id]
    assert [s.id for s in catalog.find(P_OTHER, fingerprint=fingerprint(7))] == [theirs.id]
    for call in (
        lambda: catalog.get(P_OTHER, mine.id),
        lambda: catalog.open_payload(P_OTHER, mine.id),
        lambda: catalog.set_pinned(P_OTHER, mine.id, True),
        lambda: catalog.mark_loaded(P_OTHER, mine.id),
    ):
        with pytest.raises(NotFound):
            call()
    for request in (
        PruneRequest(ids=[mine.id], dry_run=False),
        PruneRequest(filter=PruneFilter(model="demo"), dry_run=False),
        PruneRequest(all=True, confirm="all", dry_run=False),
    ):
        result = catalog.prune(P_OTHER, request)
        assert mine.id not in result.selected + result.deleted
    assert [s.id for s in catalog.list("local")] == [mine.id]
    assert read_payload(catalog, "local", mine.id) == b"local data"
    assert catalog.list(P_OTHER) == []


# -- injected disk errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "nth", "code"),
    [
        ("write_payload", 2, errno.ENOSPC),
        ("write_payload", 1, errno.EIO),
        ("fsync_file", 1, errno.EIO),  # the payload's fsync
        ("fsync_file", 2, errno.ENOSPC),  # metadata.json's fsync
        ("fsync_dir", 1, errno.EIO),  # the staging directory's fsync
    ],
)
def test_disk_errors_abort_the_commit(
    home: Path, faults: Callable[[Callable[[str], None]], None], point: str, nth: int, code: int
) -> None:
    catalog, first, second = _two_states(home)
    calls: list[str] = []

    def hook(name: str) -> None:
        calls.append(name)
        if name == point and calls.count(point) == nth:
            raise OSError(code, os.strerror(code))

    faults(hook)
    with pytest.raises((StorageError, InsufficientStorage)) as info:
        commit(catalog, payload_chunks(5, 3, 10_000))
    faults(lambda name: None)
    if code == errno.ENOSPC:  # the client can act on a full disk: a typed, retryable 507
        assert isinstance(info.value, InsufficientStorage) and info.value.retryable
        assert info.value.code is ErrorCode.UNAVAILABLE and info.value.http_status == 507
        assert "no space left" in info.value.message
    else:
        assert info.value.code is ErrorCode.INTERNAL
        assert errno.errorcode[code] in info.value.message
    assert calls.count(point) == nth  # the failed call was the last one: never retried
    assert leftovers(home) == []
    assert [s.id for s in catalog.list("local")] == [first.id, second.id]
    assert read_payload(catalog, "local", first.id) == b"first"
    assert read_payload(catalog, "local", second.id) == b"second"


def test_failed_directory_fsync_after_rename_withdraws_the_state(
    home: Path, faults: Callable[[Callable[[str], None]], None]
) -> None:
    catalog, first, second = _two_states(home)
    armed = [False]

    def hook(name: str) -> None:
        if name == "after_rename_before_dirsync":
            armed[0] = True
        elif name == "fsync_dir" and armed[0]:
            armed[0] = False
            raise OSError(errno.EIO, "Input/output error")

    faults(hook)
    with pytest.raises(StorageError):
        commit(catalog, [b"not durable"])
    assert sorted(s.id for s in catalog.list("local")) == sorted([first.id, second.id])
    catalog.reconcile()
    assert leftovers(home) == []


# -- read-only proof -----------------------------------------------------------------------------


def test_reads_change_no_byte_on_disk(tmp_path: Path) -> None:
    clock = Clock()
    home = tmp_path / "home"
    catalog = StateCatalog(home, clock=clock)
    ready = commit(catalog, [b"ready"], model="m1", fp=1)
    clock.now += 1  # listing order is creation time, then id
    loaded = commit(catalog, [b"loaded"], model="m1", fp=1, pinned=True)
    catalog.mark_loaded("local", loaded.id)
    expired = commit(catalog, [b"expired"], model="m2", fp=2, ttl=5)
    corrupt = commit(catalog, [b"corrupt"], model="m2", fp=2)
    commit(catalog, [b"theirs"], principal=P_OTHER)
    pdir = store(home) / "p_local"
    (pdir / corrupt.id / "metadata.json").write_bytes(b"{")
    staging = pdir / ".staging-abandoned"
    staging.mkdir(mode=0o700)
    (staging / "payload.bin").write_bytes(b"half")
    (pdir / ".trash-leftover").mkdir(mode=0o700)
    (pdir / loaded.id / ".tmp-leftover").write_bytes(b"")
    (pdir / "st_linkedlink1").symlink_to(pdir / ready.id)
    (pdir / "st_plainfile1").write_bytes(b"")
    (store(home) / ".quarantine").mkdir(mode=0o700)
    (store(home) / ".quarantine" / "junk").write_bytes(b"")
    clock.now += 10  # `expired` is now expired

    def every_read() -> None:
        assert [s.id for s in catalog.list("local")] == [ready.id, loaded.id]
        assert catalog.list("local", model="m2") == []
        assert catalog.get("local", loaded.id).last_accessed_at is not None
        for gone in (expired.id, corrupt.id, "st_linkedlink1", "st_plainfile1"):
            with pytest.raises(NotFound):
                catalog.get("local", gone)
        assert [s.id for s in catalog.find("local", fingerprint=fingerprint(1))] == [
            ready.id,
            loaded.id,
        ]
        assert read_payload(catalog, "local", ready.id) == b"ready"
        for request in (
            PruneRequest(all=True, confirm="all"),
            PruneRequest(ids=[ready.id, expired.id]),
            PruneRequest(filter=PruneFilter(expired=True)),
        ):
            preview = catalog.prune("local", request)
            assert preview == catalog.prune_preview("local", request)
            assert preview.selected and preview.deleted == []
        assert catalog.prune("local", PruneRequest(ids=[expired.id])).selected == [expired.id]

    before = tree_digest(home)
    every_read()
    StateCatalog(home, clock=clock).list("local")
    assert tree_digest(home) == before
    # The digest does see changes: the next mutation cleans up, and the digest moves.
    report = catalog.reconcile()
    assert tree_digest(home) != before
    assert report.staging_removed == 1 and report.trash_removed == 1
    assert report.expired_deleted == [("local", expired.id)]
    assert report.quarantined == 1 and report.unsafe_unlinked == 2


def test_reads_on_a_missing_store_create_nothing(tmp_path: Path) -> None:
    home = tmp_path / "does" / "not" / "exist"
    catalog = StateCatalog(home)
    request = PruneRequest(all=True, confirm="all")
    assert catalog.list("local") == []
    assert catalog.find("local", fingerprint=fingerprint(0)) == []
    assert catalog.prune_preview("local", request).selected == []
    assert catalog.prune("local", request).selected == []
    for call in (
        lambda: catalog.get("local", "st_abcdefgh"),
        lambda: catalog.open_payload("local", "st_abcdefgh"),
    ):
        with pytest.raises(NotFound):
            call()
    assert not (tmp_path / "does").exists()
    existing = tmp_path / "home"
    existing.mkdir()
    before = tree_digest(existing)
    assert StateCatalog(existing).list("local") == []
    assert tree_digest(existing) == before and list(existing.iterdir()) == []
