"""Reconciliation scope: a mutation rescans only what can need cleanup (werk.state.clean_marks).

Each case plants what another process or a crash would leave behind and checks that the next
mutation still cleans it; the counting test shows that filling a principal with many states
does not rescan the store once per commit (what made filling it quadratic).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _crash_child import P_OTHER, commit, leftovers, payload_chunks, store

from werk.protocol.errors import NotFound
from werk.state import reconcile
from werk.state.catalog import StateCatalog
from werk.state.clean_marks import FULL_PASS_SECONDS
from werk.state.layout import PAYLOAD


class Clocks:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0
        self.mono = 1000.0

    def wall(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def catalog(tmp_path: Path, clocks: Clocks) -> StateCatalog:
    return StateCatalog(tmp_path / "home", clock=clocks.wall, monotonic=clocks.monotonic)


@pytest.fixture
def passes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts whole-store passes and single-principal passes."""
    counts = {"full": 0, "one": 0}
    full, one = reconcile.Reconciler.run, reconcile.Reconciler.run_one

    def run(self: reconcile.Reconciler) -> reconcile.ReconcileReport:
        counts["full"] += 1
        return full(self)

    def run_one(self: reconcile.Reconciler, name: str) -> reconcile.ReconcileReport:
        counts["one"] += 1
        return one(self, name)

    monkeypatch.setattr(reconcile.Reconciler, "run", run)
    monkeypatch.setattr(reconcile.Reconciler, "run_one", run_one)
    return counts


def test_filling_one_principal_does_not_rescan_per_commit(
    catalog: StateCatalog, passes: dict[str, int]
) -> None:
    for _ in range(40):
        commit(catalog, payload_chunks(1, 1, 64))
    assert len(catalog.list("local")) == 40
    # One whole-store pass at the first mutation; the principal's directory was created by
    # this catalog, so it is scanned at most once more (never once per commit).
    assert passes["full"] == 1
    assert passes["one"] <= 1


def test_a_staging_leftover_of_another_process_is_removed_by_the_next_mutation(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    commit(catalog, payload_chunks(1, 1, 64))
    pdir = store(tmp_path / "home") / "p_local"
    os.mkdir(pdir / ".staging-deadbeefdeadbeef", 0o700)  # a commit that crashed elsewhere
    (pdir / ".staging-deadbeefdeadbeef" / "payload").write_bytes(b"partial")
    assert leftovers(tmp_path / "home")
    commit(catalog, payload_chunks(2, 1, 64))
    assert leftovers(tmp_path / "home") == []


def test_an_unsafe_entry_planted_in_the_principal_directory_is_unlinked(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    commit(catalog, payload_chunks(1, 1, 64))
    planted = store(tmp_path / "home") / "p_local" / "planted-link"
    planted.symlink_to("/etc/passwd")
    commit(catalog, payload_chunks(2, 1, 64))
    assert not planted.is_symlink()


def test_an_expired_state_goes_at_the_next_mutation_of_its_principal(
    catalog: StateCatalog, clocks: Clocks, tmp_path: Path, passes: dict[str, int]
) -> None:
    short = commit(catalog, payload_chunks(1, 1, 64), ttl=5)
    commit(catalog, payload_chunks(2, 1, 64))
    sdir = store(tmp_path / "home") / "p_local" / short.id
    assert sdir.is_dir()
    clocks.now += 10  # expired; the directory itself is unchanged
    before = passes["one"]
    commit(catalog, payload_chunks(3, 1, 64))
    assert not sdir.exists()
    assert passes["one"] == before + 1


def test_a_new_root_entry_forces_a_whole_store_pass(
    catalog: StateCatalog, tmp_path: Path, passes: dict[str, int]
) -> None:
    commit(catalog, payload_chunks(1, 1, 64))
    stray = store(tmp_path / "home") / "stray-file"
    stray.write_bytes(b"not a principal directory")
    full = passes["full"]
    commit(catalog, payload_chunks(2, 1, 64))
    assert passes["full"] == full + 1
    assert not stray.exists()


def test_other_principals_are_reconciled_at_least_every_full_pass_interval(
    catalog: StateCatalog, clocks: Clocks, tmp_path: Path
) -> None:
    other = commit(catalog, payload_chunks(1, 1, 64), principal=P_OTHER, ttl=5)
    commit(catalog, payload_chunks(2, 1, 64))
    commit(catalog, payload_chunks(3, 1, 64))
    other_dir = next(store(tmp_path / "home").glob(f"p_*/{other.id}"))
    clocks.now += 10
    commit(catalog, payload_chunks(4, 1, 64))  # scoped to "local": the other may remain
    assert catalog.list(P_OTHER) == []  # reads never show an expired state either way
    clocks.mono += FULL_PASS_SECONDS
    commit(catalog, payload_chunks(5, 1, 64))
    assert not other_dir.exists()


def test_a_suspect_payload_is_quarantined_by_the_next_mutation(
    catalog: StateCatalog, tmp_path: Path
) -> None:
    state = commit(catalog, payload_chunks(1, 1, 4096))
    commit(catalog, payload_chunks(2, 1, 64))
    payload = store(tmp_path / "home") / "p_local" / state.id / PAYLOAD
    data = bytearray(payload.read_bytes())
    data[0] ^= 0xFF  # same size, different bytes: only the hash can tell
    payload.write_bytes(bytes(data))
    with (
        pytest.raises(NotFound, match="verification"),
        catalog.open_payload("local", state.id) as f,
    ):
        f.read()
    commit(catalog, payload_chunks(3, 1, 64))
    assert not (store(tmp_path / "home") / "p_local" / state.id).exists()
    assert any((store(tmp_path / "home") / ".quarantine").iterdir())


def test_an_explicit_reconcile_is_always_a_whole_store_pass(
    catalog: StateCatalog, clocks: Clocks, passes: dict[str, int]
) -> None:
    commit(catalog, payload_chunks(1, 1, 64), principal=P_OTHER, ttl=5)
    commit(catalog, payload_chunks(2, 1, 64))
    clocks.now += 10
    full = passes["full"]
    report = catalog.reconcile()
    assert passes["full"] == full + 1
    assert [p for p, _ in report.expired_deleted] == [P_OTHER]
