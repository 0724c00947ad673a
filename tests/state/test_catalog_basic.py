"""State catalog semantics: layout, commit inputs, reads, TTL vs pin, prune, locking, quarantine."""

from __future__ import annotations

import fcntl
import io
import os
import stat
import threading
from pathlib import Path

import pytest
from _crash_child import (
    P_OTHER,
    commit,
    envelope,
    fingerprint,
    leftovers,
    payload_chunks,
    read_payload,
    store,
)

from werk.protocol.errors import InvalidRequest, NotFound
from werk.protocol.states import (
    PruneFilter,
    PruneRequest,
    PruneSkip,
    SkipReason,
    StateStatus,
    Tier,
)
from werk.state.catalog import StateCatalog, StorageError


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def catalog(tmp_path: Path, clock: Clock) -> StateCatalog:
    return StateCatalog(tmp_path / "home", clock=clock)


def test_layout_modes_and_ids(catalog: StateCatalog, tmp_path: Path) -> None:
    data = payload_chunks(1, 3, 1000)
    state = commit(catalog, data, pinned=True)
    root = store(tmp_path / "home")
    sdir = root / "p_local" / state.id
    assert sorted(p.name for p in sdir.iterdir()) == [
        "metadata.json",
        "metadata.sha256",
        "payload.bin",
        "pinned",
    ]
    assert (sdir / "payload.bin").read_bytes() == b"".join(data)
    for path in (root.parent, root, root / "p_local", sdir):
        assert stat.S_IMODE(path.lstat().st_mode) == 0o700, path
    for path in [*sdir.iterdir(), root / ".lock"]:
        assert stat.S_IMODE(path.lstat().st_mode) == 0o600, path
    assert state.id.startswith("st_") and 8 <= len(state.id) - 3 <= 64
    assert state.payload_bytes == 3000 and state.logical_bytes == 3000
    other = commit(catalog, data)
    assert other.id != state.id


def test_commit_under_a_restrictive_umask(tmp_path: Path) -> None:
    old = os.umask(0o377)  # would leave owner read-only files and directories
    try:
        catalog = StateCatalog(tmp_path / "home")
        state = commit(catalog, [b"abc"], pinned=True)
        catalog.mark_loaded("local", state.id)
    finally:
        os.umask(old)
    for path in (tmp_path / "home").rglob("*"):
        expected = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.lstat().st_mode) == expected, path
    assert read_payload(StateCatalog(tmp_path / "home"), "local", state.id) == b"abc"


@pytest.mark.parametrize("kind", ["iterable", "bytes", "path", "binaryio", "memoryview"])
def test_payload_inputs(catalog: StateCatalog, tmp_path: Path, kind: str) -> None:
    data = b"".join(payload_chunks(2, 3, 700_000))  # spans more than one 1 MiB read
    source: object
    if kind == "iterable":
        source = iter([data[:5], data[5:]])
    elif kind == "bytes":
        source = data
    elif kind == "path":
        source = tmp_path / "src.bin"
        (tmp_path / "src.bin").write_bytes(data)
    elif kind == "binaryio":
        source = io.BytesIO(data)
    else:
        source = iter([memoryview(data)[:100], memoryview(data)[100:]])
    state = catalog.commit(
        "local",
        envelope=envelope(),
        model="demo",
        backend="test",
        tier=Tier.DISK,
        fingerprint=fingerprint(0),
        payload=source,  # type: ignore[arg-type]
        ttl_seconds=None,
        pinned=False,
    )
    assert read_payload(catalog, "local", state.id) == data


def test_bad_chunks_and_failing_generators_leave_nothing(catalog: StateCatalog) -> None:
    keep = commit(catalog, [b"keep"])
    with pytest.raises(InvalidRequest):
        commit(catalog, [b"ok", "text"])  # type: ignore[list-item]

    def broken() -> object:
        yield b"partial"
        raise RuntimeError("backend went away")

    with pytest.raises(RuntimeError):
        catalog.commit(
            "local",
            envelope=envelope(),
            model="demo",
            backend="test",
            tier=Tier.DISK,
            fingerprint=fingerprint(0),
            payload=broken(),  # type: ignore[arg-type]
            ttl_seconds=None,
            pinned=False,
        )
    assert [s.id for s in catalog.list("local")] == [keep.id]
    assert leftovers(catalog._home) == []


@pytest.mark.parametrize(
    "change",
    [
        {"principal": "alice"},
        {"principal": "p_" + "A" * 64},
        {"envelope": envelope(P_OTHER)},
        {"model": ""},
        {"backend": "x" * 129},
        {"fingerprint": "pf_short"},
        {"ttl_seconds": 0},
        {"ttl_seconds": 2_592_001},
        {"ttl_seconds": True},
        {"logical_bytes": -1},
        {"tier": "disk"},
    ],
)
def test_commit_validates_every_argument(catalog: StateCatalog, change: dict[str, object]) -> None:
    kwargs: dict[str, object] = {
        "envelope": envelope(),
        "model": "demo",
        "backend": "test",
        "tier": Tier.DISK,
        "fingerprint": fingerprint(0),
        "payload": [b"x"],
        "ttl_seconds": None,
        "pinned": False,
    }
    principal = str(change.pop("principal", "local"))
    kwargs.update(change)
    with pytest.raises(InvalidRequest):
        catalog.commit(principal, **kwargs)  # type: ignore[arg-type]
    assert catalog.list("local") == []


def test_reads_filters_and_find(catalog: StateCatalog, clock: Clock) -> None:
    a = commit(catalog, [b"a"], model="m1", tier=Tier.DISK, fp=1)
    clock.now += 1  # listing order is creation time, then id
    b = commit(catalog, [b"b"], model="m2", tier=Tier.RAM, fp=2, pinned=True)
    clock.now += 1
    c = commit(catalog, [b"c"], model="m1", tier=Tier.RAM, fp=1)
    assert [s.id for s in catalog.list("local")] == [a.id, b.id, c.id]
    assert [s.id for s in catalog.list("local", model="m1")] == [a.id, c.id]
    assert [s.id for s in catalog.list("local", tier=Tier.RAM)] == [b.id, c.id]
    assert [s.id for s in catalog.list("local", pinned=True)] == [b.id]
    assert [s.id for s in catalog.list("local", pinned=False, model="m1", tier=Tier.RAM)] == [c.id]
    assert [s.id for s in catalog.find("local", fingerprint=fingerprint(1))] == [a.id, c.id]
    assert catalog.find("local", fingerprint=fingerprint(3)) == []
    assert catalog.get("local", b.id) == b
    for bad in ("st_nope12345", "nope", "st_../../etc", ""):
        with pytest.raises(NotFound):
            catalog.get("local", bad)
    with pytest.raises(InvalidRequest):
        catalog.list("root")


def test_summary_is_the_protocol_view(catalog: StateCatalog, clock: Clock) -> None:
    clock.now = 1_700_000_000.25
    state = commit(catalog, [b"abc"], ttl=60, pinned=True)
    summary = state.summary(reusable=True)
    assert summary.id == state.id and summary.status is StateStatus.READY
    assert summary.created_at == "2023-11-14T22:13:20.250Z"
    assert summary.expires_at == "2023-11-14T22:14:20.250Z"
    assert summary.last_accessed_at is None and summary.pinned and summary.reusable
    assert summary.logical_bytes == 3
    assert state.summary(reusable=False).reusable is False
    later = state.summary(reusable=True, now=clock.now + 61)
    assert later.status is StateStatus.EXPIRED and later.reusable is False


def test_mark_loaded_and_pin(catalog: StateCatalog, clock: Clock, tmp_path: Path) -> None:
    state = commit(catalog, [b"abc"])
    sdir = store(tmp_path / "home") / "p_local" / state.id
    assert not (sdir / "last-accessed").exists()
    clock.now += 5
    catalog.mark_loaded("local", state.id)
    assert catalog.get("local", state.id).last_accessed_at == clock.now
    assert stat.S_IMODE((sdir / "last-accessed").stat().st_mode) == 0o600
    assert catalog.set_pinned("local", state.id, True).pinned
    assert (sdir / "pinned").exists() and catalog.get("local", state.id).pinned
    assert catalog.set_pinned("local", state.id, True).pinned  # idempotent
    assert not catalog.set_pinned("local", state.id, False).pinned
    assert not (sdir / "pinned").exists()
    for call in (
        lambda: catalog.set_pinned("local", "st_unknown123", True),
        lambda: catalog.mark_loaded("local", "st_unknown123"),
        lambda: catalog.set_pinned(P_OTHER, state.id, True),
    ):
        with pytest.raises(NotFound):
            call()


def test_ttl_is_stronger_than_pin(catalog: StateCatalog, clock: Clock, tmp_path: Path) -> None:
    pinned = commit(catalog, [b"p"], ttl=10, pinned=True)
    forever = commit(catalog, [b"f"], pinned=True)
    clock.now += 10
    assert [s.id for s in catalog.list("local")] == [forever.id]
    for call in (
        lambda: catalog.get("local", pinned.id),
        lambda: catalog.open_payload("local", pinned.id),
        lambda: catalog.set_pinned("local", pinned.id, True),
    ):
        with pytest.raises(NotFound):
            call()
    # set_pinned was a mutation: its reconciliation deleted the expired (pinned) state.
    assert not (store(tmp_path / "home") / "p_local" / pinned.id).exists()
    assert catalog.get("local", forever.id).pinned


def test_reconcile_reports_expired(catalog: StateCatalog, clock: Clock, tmp_path: Path) -> None:
    gone = commit(catalog, [b"x"], ttl=1)
    clock.now += 1
    assert (store(tmp_path / "home") / "p_local" / gone.id).exists()  # reads did not delete
    report = catalog.reconcile()
    assert report.expired_deleted == [("local", gone.id)]
    assert not (store(tmp_path / "home") / "p_local" / gone.id).exists()


def test_prune_selectors_skips_and_dry_run(catalog: StateCatalog, clock: Clock) -> None:
    old = commit(catalog, [b"1"], model="m1", tier=Tier.DISK)
    clock.now += 100
    pinned = commit(catalog, [b"2"], model="m1", tier=Tier.RAM, pinned=True)
    clock.now += 1
    busy = commit(catalog, [b"3"], model="m2", tier=Tier.DISK)
    clock.now += 1
    active = commit(catalog, [b"4"], model="m2", tier=Tier.RAM)
    clock.now += 1
    expiring = commit(catalog, [b"5"], model="m2", tier=Tier.RAM, ttl=5, pinned=True)
    clock.now += 5  # `expiring` is now expired although pinned

    reasons = {busy.id: SkipReason.LIVE_HANDOFF, active.id: SkipReason.ACTIVE}

    def busy_check(state_id: str) -> SkipReason | None:
        return reasons.get(state_id)

    everything = PruneRequest(all=True, confirm="all")
    preview = catalog.prune(P_OTHER, everything, busy=busy_check)
    assert preview.selected == [] and preview.dry_run
    preview = catalog.prune("local", everything, busy=busy_check)  # dry run is the default
    assert preview.dry_run and preview.deleted == []
    assert preview.selected == [old.id, pinned.id, busy.id, active.id, expiring.id]
    assert preview.skipped == [
        PruneSkip(id=pinned.id, reason=SkipReason.PINNED),
        PruneSkip(id=busy.id, reason=SkipReason.LIVE_HANDOFF),
        PruneSkip(id=active.id, reason=SkipReason.ACTIVE),
    ]
    assert catalog.prune_preview("local", everything, busy=busy_check) == preview
    assert len(catalog.list("local")) == 4  # nothing deleted by previews

    expired_only = PruneRequest(filter=PruneFilter(expired=True), dry_run=False)
    result = catalog.prune("local", expired_only)
    assert result.selected == result.deleted == [expiring.id]
    # (any other mutation would also have deleted it, unreported)

    by_filter = PruneRequest(filter=PruneFilter(older_than_seconds=100), dry_run=False)
    result = catalog.prune("local", by_filter, busy=busy_check)
    assert result.selected == [old.id] and result.deleted == [old.id]

    by_ids = PruneRequest(ids=[active.id, "st_unknown123", active.id, busy.id], dry_run=False)
    result = catalog.prune("local", by_ids, busy=busy_check)
    assert result.selected == [active.id, busy.id] and result.deleted == []
    assert [s.reason for s in result.skipped] == [SkipReason.ACTIVE, SkipReason.LIVE_HANDOFF]

    by_model = PruneRequest(filter=PruneFilter(model="m2", tier=Tier.RAM), dry_run=False)
    result = catalog.prune("local", by_model)
    assert result.selected == result.deleted == [active.id]
    result = catalog.prune("local", PruneRequest(all=True, confirm="all", dry_run=False))
    assert result.deleted == [busy.id] and [s.id for s in result.skipped] == [pinned.id]
    assert [s.id for s in catalog.list("local")] == [pinned.id]


def test_quarantine_is_bounded_by_count_and_age(tmp_path: Path, clock: Clock) -> None:
    catalog = StateCatalog(
        tmp_path / "home", clock=clock, quarantine_max_entries=2, quarantine_max_age_seconds=100
    )
    keep = commit(catalog, [b"keep"])
    pdir = store(tmp_path / "home") / "p_local"
    quarantine = store(tmp_path / "home") / ".quarantine"
    for i in range(5):
        bad = pdir / f"st_corrupt{i:04d}"
        bad.mkdir(mode=0o700)
        clock.now += 1
        catalog.reconcile()
    assert len(list(quarantine.iterdir())) == 2
    (quarantine / "not-a-quarantine-name").mkdir()
    (quarantine / "stray-file").write_bytes(b"")
    clock.now += 101
    report = catalog.reconcile()
    assert report.quarantine_deleted == 4 and list(quarantine.iterdir()) == []
    assert [s.id for s in catalog.list("local")] == [keep.id]


def test_live_staging_survives_reconcile_abandoned_does_not(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    commit(catalog, [b"x"])
    staging = store(tmp_path / "home") / "p_local" / ".staging-inflight"
    staging.mkdir(mode=0o700)
    fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a live commit holds
        assert catalog.reconcile().staging_removed == 0
        assert staging.exists()
    finally:
        os.close(fd)  # the writer "died"
    assert catalog.reconcile().staging_removed == 1
    assert not staging.exists()


def test_threads_commit_and_prune_concurrently(catalog: StateCatalog) -> None:
    ids: list[str] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(4):
                state = commit(catalog, payload_chunks(n * 10 + i, 2, 5000), fp=n)
                ids.append(state.id)
                if i % 2:
                    catalog.prune("local", PruneRequest(ids=[state.id], dry_run=False))
                    ids.remove(state.id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(s.id for s in catalog.list("local")) == sorted(ids)
    for state_id in ids:
        read_payload(catalog, "local", state_id)
    assert leftovers(catalog._home) == []


def test_unsafe_store_roots(tmp_path: Path) -> None:
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    real = StateCatalog(elsewhere)
    commit(real, [b"x"])
    home.mkdir()
    (home / "runtime-state").symlink_to(elsewhere / "runtime-state")
    catalog = StateCatalog(home)
    assert catalog.list("local") == []
    with pytest.raises(StorageError):
        commit(catalog, [b"y"])
    assert len(real.list("local")) == 1


def test_planted_lock_link_is_replaced_not_followed(tmp_path: Path) -> None:
    catalog = StateCatalog(tmp_path / "home")
    commit(catalog, [b"x"])
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    lock = store(tmp_path / "home") / ".lock"
    lock.unlink()
    lock.symlink_to(target)
    commit(catalog, [b"y"])
    assert not lock.is_symlink() and lock.is_file()
    assert target.read_bytes() == b"precious"
    assert len(catalog.list("local")) == 2


def test_export_payload_copies_verified_bytes_in_one_pass(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    data = payload_chunks(7, 3, 100_000)
    state = commit(catalog, data)
    target = tmp_path / "scratch" / "restore.bin"
    target.parent.mkdir()
    catalog.export_payload("local", state.id, target)
    assert target.read_bytes() == b"".join(data)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(StorageError):
        catalog.export_payload("local", state.id, target)  # never over an existing path
    with pytest.raises(NotFound):
        catalog.export_payload(P_OTHER, state.id, tmp_path / "scratch" / "other.bin")
    assert not (tmp_path / "scratch" / "other.bin").exists()


def test_export_payload_refuses_a_corrupt_payload_and_leaves_nothing(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    state = commit(catalog, payload_chunks(8, 2, 50_000))
    payload = store(tmp_path / "home") / "p_local" / state.id / "payload.bin"
    data = bytearray(payload.read_bytes())
    data[-1] ^= 0x01
    payload.write_bytes(bytes(data))
    target = tmp_path / "restore.bin"
    with pytest.raises(NotFound, match="verification"):
        catalog.export_payload("local", state.id, target)
    assert not target.exists()
    commit(catalog, payload_chunks(9, 1, 10))  # the next mutation quarantines the suspect
    assert not (store(tmp_path / "home") / "p_local" / state.id).exists()
