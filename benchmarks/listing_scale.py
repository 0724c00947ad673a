"""Listing scale: 100 sequential ``GET /werk/v1/states`` with 10,000 states of one principal vs
with 100.

Two homes are filled through the real state catalog (``StateCatalog.commit``, 16-byte payloads,
principal ``local``: what an unauthenticated local ``werk serve`` answers for), each is served by
a real ``werk serve`` with no model, and one keep-alive client lists the states 100 times in a
row. A listing that is linear in the number of states costs about 100× more with 100× the
states; the goal (issue 15) is a ratio ≤ 100 (no quadratic scans). The in-process
``StateCatalog.list`` time is printed beside it, and so is the time the commits took (each
commit reconciles only what can need it, so filling is linear too: before that change, 2,000
states took 93 s here because every commit rescanned the whole store).

A first page (``?limit=100``) is timed the same way: the store lists the directory and reads
the metadata of that page's states only.

Run: ``.venv/bin/python benchmarks/listing_scale.py [--small 100] [--large 10000] [--rounds 100]
[--page 100] [--page-rounds 100]`` (``--large 100000 --rounds 0`` for the page alone at scale).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
from llamacpp_proxy_overhead import werk_serve

from werk.protocol.states import Tier
from werk.state.catalog import StateCatalog
from werk.state.envelope import Envelope

PRINCIPAL = "local"


def fill(home: Path, count: int) -> float:
    """Commit ``count`` tiny disk states; returns the seconds it took."""
    catalog = StateCatalog(home)
    envelope = Envelope(
        adapter="bench", adapter_version="0", backend="bench", executable="",
        model_identity="sha256:" + "0" * 64, runtime_args=(), cache_layout="bench",
        generation="g1", principal=PRINCIPAL,
    )  # fmt: skip
    start = time.perf_counter()
    for index in range(count):
        catalog.commit(
            PRINCIPAL, envelope=envelope, model="bench", backend="bench", tier=Tier.DISK,
            fingerprint=f"pf_{index:064x}", payload=iter([index.to_bytes(16, "little")]),
            ttl_seconds=None, pinned=False,
        )  # fmt: skip
    return time.perf_counter() - start


def listed(
    home: Path, rounds: int, page_rounds: int, page: int, expected: int, log: Path
) -> tuple[float, float, float]:
    """(seconds per full HTTP listing, seconds for one in-process listing, seconds per first
    page of ``page`` states)."""
    start = time.perf_counter()
    assert len(StateCatalog(home).list(PRINCIPAL)) == expected
    in_process = time.perf_counter() - start
    with (
        werk_serve(home, [], log) as served,
        httpx.Client(base_url=served.url, timeout=600) as http,
    ):
        first = http.get("/werk/v1/states", params={"limit": page})
        first.raise_for_status()
        assert len(first.json()["states"]) == min(page, expected)
        start = time.perf_counter()
        for _ in range(page_rounds):
            http.get("/werk/v1/states", params={"limit": page}).raise_for_status()
        paged = (time.perf_counter() - start) / page_rounds
        full = float("nan")
        if rounds:
            answer = http.get("/werk/v1/states")
            answer.raise_for_status()
            assert len(answer.json()["states"]) == expected, "the server lists another number"
            start = time.perf_counter()
            for _ in range(rounds):
                http.get("/werk/v1/states").raise_for_status()
            full = (time.perf_counter() - start) / rounds
        return full, in_process, paged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=100, help="full listings per size")
    parser.add_argument("--page", type=int, default=100, help="states per page")
    parser.add_argument("--page-rounds", type=int, default=100, help="first pages per size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        work = Path(tmp)
        full: dict[int, float] = {}
        paged: dict[int, float] = {}
        for count in (args.small, args.large):
            home = work / f"home-{count}"
            home.mkdir()
            filled = fill(home, count)
            full[count], in_process, paged[count] = listed(
                home, args.rounds, args.page_rounds, args.page, count,
                work / f"serve-{count}.log",
            )  # fmt: skip
            print(
                f"{count:>6} states: committed in {filled:.1f} s; full listing "
                f"{full[count] * 1000:.1f} ms each ({args.rounds}); first page of {args.page} "
                f"{paged[count] * 1000:.1f} ms each ({args.page_rounds}); "
                f"StateCatalog.list {in_process * 1000:.1f} ms"
            )
        if args.rounds:
            ratio = full[args.large] / full[args.small]
            print(
                f"full listing, {args.large} / {args.small} states: {ratio:.1f}x "
                f"(goal <= {args.large / args.small:.0f}x: linear or better)"
            )
        print(
            f"first page of {args.page}, {args.large} / {args.small} states: "
            f"{paged[args.large] / paged[args.small]:.2f}x (goal: the time of a page with "
            f"{args.small})"
        )


if __name__ == "__main__":
    main()
