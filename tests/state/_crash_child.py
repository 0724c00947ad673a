"""Child-process driver for the catalog crash matrix and concurrency tests, plus shared helpers.

Run as a script::

    python _crash_child.py HOME kill OPERATION POINT NTH ARGS_JSON
        install a fault hook that SIGKILLs this process the NTH time POINT is reached, then run
        OPERATION (commit | prune | reconcile | pin | load). Exit 3 if POINT was never reached.
    python _crash_child.py HOME hammer WORKER ITERATIONS SEED
        mix commits, prunes, pins and verified loads on a shared store; print a JSON record of
        what this worker committed and deleted.

Imported by the tests for the helpers below (payload generation, envelopes, tree digests).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import stat
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # running as a script from any directory
    sys.path.insert(0, str(ROOT))

from werk import _fs  # noqa: E402
from werk.protocol.errors import NotFound  # noqa: E402
from werk.protocol.states import PruneFilter, PruneRequest, Tier  # noqa: E402
from werk.state.catalog import StateCatalog, StoredState  # noqa: E402
from werk.state.envelope import Envelope  # noqa: E402

CHILD = Path(__file__).resolve()
P_OTHER = "p_" + "ab" * 32


def envelope(principal: str = "local", generation: str = "g1") -> Envelope:
    return Envelope(
        adapter="werk-test",
        adapter_version="1.0",
        backend="test",
        executable="sha256:" + "1" * 64,
        model_identity="sha256:" + "2" * 64,
        runtime_args=("--ctx", "4096"),
        cache_layout="test-v1",
        generation=generation,
        principal=principal,
    )


def fingerprint(n: int) -> str:
    return "pf_" + hashlib.sha256(str(n).encode()).hexdigest()


def payload_chunks(seed: int, chunks: int, size: int) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(chunks)]


def commit(
    catalog: StateCatalog,
    data: list[bytes],
    *,
    principal: str = "local",
    model: str = "demo",
    tier: Tier = Tier.DISK,
    fp: int = 0,
    ttl: int | None = None,
    pinned: bool = False,
) -> StoredState:
    return catalog.commit(
        principal,
        envelope=envelope(principal),
        model=model,
        backend="test",
        tier=tier,
        fingerprint=fingerprint(fp),
        payload=iter(data),
        ttl_seconds=ttl,
        pinned=pinned,
        logical_bytes=sum(len(c) for c in data),
    )


def read_payload(catalog: StateCatalog, principal: str, state_id: str) -> bytes:
    with catalog.open_payload(principal, state_id) as stream:
        return stream.read()


def tree_digest(root: Path) -> str:
    """A digest of every entry below ``root`` (lstat: path, type, mode, owner, size, inode,
    link count, mtime and ctime; file contents; link targets). Never follows a link."""
    digest = hashlib.sha256()
    entries: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = os.lstat(path)
            record = (
                f"{path.relative_to(root)}|{st.st_mode:o}|{st.st_uid}|{st.st_size}|{st.st_ino}|"
                f"{st.st_nlink}|{st.st_mtime_ns}|{st.st_ctime_ns}"
            )
            if stat.S_ISLNK(st.st_mode):
                record += "|->" + os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                record += "|" + hashlib.sha256(path.read_bytes()).hexdigest()
            entries.append(record)
    st = os.lstat(root)
    entries.append(f".|{st.st_mode:o}|{st.st_mtime_ns}|{st.st_ctime_ns}")
    for record in sorted(entries):
        digest.update(record.encode() + b"\n")
    return digest.hexdigest()


def store(home: Path) -> Path:
    return home / "runtime-state" / "v1"


def leftovers(home: Path) -> list[str]:
    """Staging, trash and temporary entries anywhere in the store."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(store(home)):
        for name in dirnames + filenames:
            if name.startswith((".staging-", ".trash-", ".tmp-")):
                found.append(str(Path(dirpath, name).relative_to(home)))
    return found


# -- child modes -------------------------------------------------------------------------------


def _install_kill(point: str, nth: int) -> list[int]:
    seen = [0]

    def hook(name: str) -> None:
        if name == point:
            seen[0] += 1
            if seen[0] >= nth:
                os.kill(os.getpid(), signal.SIGKILL)

    _fs._FAULTS = hook
    return seen


def _kill_mode(home: Path, operation: str, point: str, nth: int, args: dict[str, Any]) -> int:
    catalog = StateCatalog(home)
    _install_kill(point, nth)
    if operation == "commit":
        data = payload_chunks(args["seed"], args["chunks"], args["size"])
        commit(catalog, data, pinned=args.get("pinned", False))
    elif operation == "prune":
        catalog.prune("local", PruneRequest(ids=args["ids"], dry_run=False))
    elif operation == "reconcile":
        catalog.reconcile()
    elif operation == "pin":
        catalog.set_pinned("local", args["id"], True)
    elif operation == "load":
        catalog.mark_loaded("local", args["id"])
    else:
        raise SystemExit(f"unknown operation {operation}")
    print(f"point {point!r} was never reached during {operation}", file=sys.stderr)
    return 3


def _hammer(home: Path, worker: int, iterations: int, seed: int) -> int:
    rng = random.Random(seed)
    catalog = StateCatalog(home)
    committed: dict[str, str] = {}
    deleted: list[str] = []
    verified = 0
    for i in range(iterations):
        roll = rng.random()
        if roll < 0.55:
            data = payload_chunks(seed * 1000 + i, rng.randint(1, 3), rng.randint(1, 96 * 1024))
            state = commit(catalog, data, model=f"m{worker}", fp=worker, pinned=rng.random() < 0.1)
            committed[state.id] = hashlib.sha256(b"".join(data)).hexdigest()
        elif roll < 0.75:
            listed = catalog.list("local")
            if listed:
                ids = [s.id for s in rng.sample(listed, k=min(len(listed), rng.randint(1, 3)))]
                deleted += catalog.prune("local", PruneRequest(ids=ids, dry_run=False)).deleted
        elif roll < 0.82:
            request = PruneRequest(filter=PruneFilter(model=f"m{worker}"), dry_run=False)
            deleted += catalog.prune("local", request).deleted
        elif roll < 0.9:
            listed = catalog.list("local")
            if listed:
                target = rng.choice(listed)
                with contextlib.suppress(NotFound):  # deleted by the other worker meanwhile
                    catalog.set_pinned("local", target.id, not target.pinned)
        else:
            listed = catalog.list("local")
            if listed:
                target = rng.choice(listed)
                try:
                    with catalog.open_payload("local", target.id) as stream:
                        got = hashlib.sha256(stream.read()).hexdigest()
                    if got != target.payload_sha256:
                        print(f"verified payload differs for {target.id}", file=sys.stderr)
                        return 4
                    catalog.mark_loaded("local", target.id)
                    verified += 1
                except NotFound:
                    pass
    print(json.dumps({"committed": committed, "deleted": deleted, "verified": verified}))
    return 0


def main(argv: list[str]) -> int:
    home, mode = Path(argv[1]), argv[2]
    if mode == "kill":
        return _kill_mode(home, argv[3], argv[4], int(argv[5]), json.loads(argv[6]))
    if mode == "hammer":
        return _hammer(home, int(argv[3]), int(argv[4]), int(argv[5]))
    raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
