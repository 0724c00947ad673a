"""Commit throughput of the state catalog against a one-pass ``write + sha256 + fsync`` baseline.

Both runs stream the same 256 MiB (256 chunks of 1 MiB from a generator) to the same file
system. The baseline is the least any crash-safe commit must do: write every byte once, hash
it in the same pass, fsync the file. The catalog additionally writes metadata, fsyncs the
staging and principal directories, renames, and reconciles first. Goal (issue 15): ratio <= 1.10.

Run: ``.venv/bin/python benchmarks/store_commit.py [--mib 256] [--repeat 3] [--dir PATH]``.
The figures are printed, never asserted: the best of ``--repeat`` runs for each, and medians.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from werk.protocol.states import PruneRequest, Tier
from werk.state.catalog import StateCatalog
from werk.state.envelope import Envelope

CHUNK = 1024 * 1024


def chunks(mib: int) -> Iterator[bytes]:
    block = os.urandom(CHUNK)
    for i in range(mib):
        # Vary each chunk cheaply so no layer can deduplicate identical blocks.
        yield i.to_bytes(8, "little") + block[8:]


def baseline(directory: Path, mib: int) -> float:
    path = directory / f"baseline-{os.getpid()}.bin"
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        digest = hashlib.sha256()
        for chunk in chunks(mib):
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    digest.hexdigest()
    path.unlink()
    return elapsed


def catalog_commit(directory: Path, mib: int) -> float:
    catalog = StateCatalog(directory / "home")
    envelope = Envelope(
        adapter="bench", adapter_version="0", backend="bench", executable="",
        model_identity="sha256:" + "0" * 64, runtime_args=(), cache_layout="bench",
        generation="g1", principal="local",
    )  # fmt: skip
    start = time.perf_counter()
    state = catalog.commit(
        "local", envelope=envelope, model="bench", backend="bench", tier=Tier.DISK,
        fingerprint="pf_" + "0" * 64, payload=chunks(mib), ttl_seconds=None, pinned=False,
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    assert state.payload_bytes == mib * CHUNK
    catalog.prune("local", PruneRequest(ids=[state.id], dry_run=False))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        base: list[float] = []
        store: list[float] = []
        for _ in range(args.repeat):  # interleave so drift affects both alike
            os.sync()  # start each timed run without the previous run's writeback pending
            base.append(baseline(directory, args.mib))
            os.sync()
            store.append(catalog_commit(directory, args.mib))
    b, s = min(base), min(store)
    mib = args.mib
    print(f"filesystem: {directory.parent} ({args.repeat} runs each, best shown)")
    print(f"baseline write+sha256+fsync {mib} MiB: {b:.3f} s ({mib / b:.0f} MiB/s)")
    print(f"catalog commit              {mib} MiB: {s:.3f} s ({mib / s:.0f} MiB/s)")
    print(f"ratio commit/baseline: {s / b:.3f} (goal <= 1.10)")
    mb, ms = statistics.median(base), statistics.median(store)
    print(f"medians: baseline {mb:.3f} s, commit {ms:.3f} s, ratio {ms / mb:.3f}")
    print("all runs baseline: " + ", ".join(f"{x:.3f}" for x in base))
    print("all runs commit:   " + ", ".join(f"{x:.3f}" for x in store))


if __name__ == "__main__":
    main()
