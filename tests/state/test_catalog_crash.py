"""Crash matrix (SIGKILL at every injected point) and two-process concurrency on one store.

Each crash case pre-populates committed states, then runs a *real child process* that installs
a fault hook and kills itself with SIGKILL at one named point of one operation. Afterwards a
fresh catalog in this (different) process must list every previously committed state intact,
hash-verified through ``open_payload``, show no half state, and the next mutation must clean up
every leftover (staging, trash, temporary files) with quarantine within its bound.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from _crash_child import (
    CHILD,
    commit,
    leftovers,
    payload_chunks,
    read_payload,
    store,
)

from werk.state.catalog import StateCatalog, StoredState

# (operation, point, nth occurrence, plant a corrupt entry first, debris expected after kill)
CASES: list[tuple[str, str, int, bool, str | None]] = [
    ("commit", "before_staging_write", 1, False, ".staging-"),
    ("commit", "mid_payload", 2, False, ".staging-"),
    ("commit", "after_payload_fsync", 1, False, ".staging-"),
    ("commit", "before_rename", 1, False, ".staging-"),
    ("commit", "after_rename_before_dirsync", 1, False, None),
    ("commit", "mid_quarantine", 1, True, None),
    ("prune", "mid_prune", 1, False, None),
    ("prune", "mid_quarantine", 1, True, None),
    ("reconcile", "mid_quarantine", 1, True, None),
    ("pin", "fsync_file", 1, False, ".tmp-"),
    ("load", "fsync_file", 1, False, ".tmp-"),
]

CHILD_PAYLOAD = {"seed": 99, "chunks": 4, "size": 100_000}
CORRUPT_ID = "st_corruptcorrupt"


def _plant_corrupt(home: Path) -> None:
    bad = store(home) / "p_local" / CORRUPT_ID
    bad.mkdir(mode=0o700)
    for name, data in (("metadata.json", b'{"schema": 1, "id"'), ("payload.bin", b"x")):
        (bad / name).write_bytes(data)
        (bad / name).chmod(0o600)


def _same(a: StoredState, b: StoredState, *, operation: str) -> bool:
    fields = ["id", "envelope", "model", "backend", "tier", "fingerprint", "created_at"]
    fields += ["expires_at", "logical_bytes", "payload_bytes", "payload_sha256"]
    if operation not in ("pin", "load"):  # those may legitimately have completed
        fields += ["pinned", "last_accessed_at"]
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _state_dirs(home: Path) -> set[str]:
    pdir = store(home) / "p_local"
    return {p.name for p in pdir.iterdir() if p.name.startswith("st_")} if pdir.exists() else set()


def _run_case(tmp: Path, index: int, case: tuple[str, str, int, bool, str | None]) -> int:
    operation, point, nth, corrupt, debris = case
    home = tmp / f"case-{index}"
    catalog = StateCatalog(home)
    pre: dict[str, tuple[StoredState, bytes]] = {}
    for j in range(3):
        data = payload_chunks(j, 2, 50_000)
        state = commit(catalog, data, fp=j, pinned=j == 0, ttl=3600 if j == 1 else None)
        pre[state.id] = (state, b"".join(data))
    ids = list(pre)
    if corrupt:
        _plant_corrupt(home)
    args: dict[str, Any] = dict(CHILD_PAYLOAD)
    if operation == "prune":
        args = {"ids": ids[1:]}
    elif operation in ("pin", "load"):
        args = {"id": ids[1]}
    command = [sys.executable, str(CHILD), str(home), "kill", operation, point, str(nth)]
    proc = subprocess.run(
        [*command, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, (case, proc.returncode, proc.stderr)
    if debris is not None:  # the crash really left something half-done behind
        assert any(debris in entry for entry in leftovers(home)), (case, leftovers(home))

    may_vanish = set(args.get("ids", [])) if operation == "prune" else set()
    child_data = b"".join(payload_chunks(99, 4, 100_000))

    def lost_after(fresh: StateCatalog) -> int:
        listed = {s.id: s for s in fresh.list("local")}
        lost = 0
        for sid, (state, data) in pre.items():
            if sid in listed:
                ok = _same(listed[sid], state, operation=operation)
                ok = ok and read_payload(fresh, "local", sid) == data
            else:
                ok = sid in may_vanish
            lost += not ok
        extra = set(listed) - set(pre)
        # The only state that may appear is the child's commit, complete and verified.
        assert operation == "commit" or not extra, (case, extra)
        assert len(extra) <= 1, (case, extra)
        for sid in extra:
            assert read_payload(fresh, "local", sid) == child_data, case
        # Never a half state: every published directory on disk is a valid, listed state.
        assert _state_dirs(home) - {CORRUPT_ID} == set(listed), case
        return lost

    lost = lost_after(StateCatalog(home))  # a fresh catalog, in a process other than the child
    fresh = StateCatalog(home)
    fresh.reconcile()  # the next mutation cleans up
    assert leftovers(home) == [], (case, leftovers(home))
    assert CORRUPT_ID not in _state_dirs(home)
    quarantine = store(home) / ".quarantine"
    assert not quarantine.exists() or len(list(quarantine.iterdir())) <= 64
    if corrupt:
        assert len(list(quarantine.iterdir())) == 1, case
    lost += lost_after(StateCatalog(home))
    return lost


def test_crash_matrix(tmp_path: Path) -> None:
    total_lost = 0
    per_case: list[str] = []
    for index, case in enumerate(CASES):
        lost = _run_case(tmp_path, index, case)
        per_case.append(f"{case[0]}×{case[1]}: {lost} lost")
        total_lost += lost
    print("\n" + "\n".join(per_case))
    print(f"crash matrix: {len(CASES)} cases, {total_lost} lost")
    assert len(CASES) == 11
    assert total_lost == 0


def test_two_processes_hammer_one_store(tmp_path: Path) -> None:
    home = tmp_path / "home"
    iterations = 40
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(home), "hammer", str(w), str(iterations), str(w + 7)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in (1, 2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    committed: dict[str, str] = {}
    deleted: list[str] = []
    for result in results:
        committed.update(result["committed"])
        deleted += result["deleted"]
    assert len(deleted) == len(set(deleted)), "a state was reported deleted twice"
    assert set(deleted) <= set(committed)
    catalog = StateCatalog(home)
    listed = catalog.list("local")
    # Exact accounting: everything committed and not reported deleted is there, nothing else.
    assert {s.id for s in listed} == set(committed) - set(deleted)
    for state in listed:
        data = read_payload(catalog, "local", state.id)
        assert hashlib.sha256(data).hexdigest() == committed[state.id] == state.payload_sha256
    assert len(committed) > 10 and deleted  # both kinds of mutation really happened
    catalog.reconcile()
    assert leftovers(home) == []
    assert not (store(home) / ".quarantine").exists()  # nothing was ever corrupt
