"""A relay's CPU time per request under eight concurrent clients: Werk's against the least relay.

The llama.cpp benchmark (``benchmarks/llamacpp_proxy_overhead.py``) measures ``werk serve``'s CPU
per request one request at a time, in 10 ms ticks over 200 requests (steps of 50 µs), and under
concurrency only req/s, whose ratios stray by ±0.1 from run to run on the 2-core machine. CPU time
is what a relay takes from llama-server there, and summed over 30 rounds it read within about ±25 µs
per request from run to run (runs of 2026-12-07). One ``werk serve --model demo`` (the tiny
generated demo model) and its llama-server child; in one rotation of concurrent rounds
(``--clients`` 8 × ``--per-client`` 50 short chats each, the order rotating by one side each round):

* ``werk``: Werk's ``/v1``;
* ``direct``: the child itself (llama-server picks among all its slots, the state slot
  included);
* ``pinned``: ``benchmarks/minimal_relay.py --pin-slots`` (the least relay that keeps the state
  slot free, as Werk does);
* ``burn N`` (``--burn N …``): that relay spending N µs more CPU on every request;
* ``sleep N`` (``--sleep N …``): that relay waiting N µs on every request without CPU;
* ``unreserved`` (``--unreserved``): a second llama-server started with the child's own
  arguments but without the state slot (``-np`` the general slots only, the context scaled to
  match, no slot directory), reached directly: what a user who runs llama-server with Werk's
  ``/v1`` slot count gets. Its ratio to ``direct`` is what the state slot gives direct requests
  (the second server idles while the others are measured).

``--native ARG …`` gives the demo model those native llama-server arguments (its
``native_args`` option), e.g. ``--native -t 1``; the unreserved server gets them too.

For each side: the median req/s over ``--rounds`` rounds, its ratio to ``pinned`` and to
``direct``, and the relay process's CPU time per request (user + system, all threads, from
``/proc``, summed over all rounds); then Werk's CPU per request over the pinned relay's. The
burn and sleep sides are calibrated costs: what a known amount of a relay's CPU, or of its
latency, does to req/s here (on 2-core runs of 30 rounds, less than the rounds' own spread).

Run: ``.venv/bin/python benchmarks/relay_cost.py [--rounds 30] [--burn 50 100 200] [--sleep
400] [--unreserved] [--native ARG …]``. Figures are printed, never asserted; a round takes about
a second, so 30 rounds of three sides take about a minute and a half.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from controls import relay_process
from llamacpp_proxy_overhead import (
    CHAT,
    _post,
    concurrent,
    cpu_seconds,
    create_demo,
    free_port,
    general_slots,
    managed_child,
    wait_http,
    werk_serve,
)

from werk.supervise import stop_group


@dataclass
class Side:
    """One side of the rotation: where its requests go, which process relays them (``None``
    for the direct side), what each round measured."""

    url: str
    headers: dict[str, str]
    relay_pid: int | None
    rates: list[float] = field(default_factory=list)
    cpu_total: float = 0.0
    requests: int = 0

    def cpu_ms(self) -> float | None:
        """The relay's CPU time per request over all rounds (``None`` for the direct side);
        summed over the rounds, not one round at a time: ``/proc`` counts CPU time in 10 ms
        ticks, a round's 400 requests would see it in steps of 25 µs per request."""
        return self.cpu_total / self.requests * 1e3 if self.relay_pid else None


def measure(sides: dict[str, Side], rounds: int, clients: int, per_client: int) -> None:
    """``rounds`` rounds, every side once per round, the order rotating by one each round."""
    names = list(sides)
    requests = clients * (per_client + 1)  # each client's warm-up request counts as CPU too
    for round_ in range(rounds):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            side = sides[name]
            before = cpu_seconds(side.relay_pid) if side.relay_pid else 0.0
            side.rates.append(concurrent(side.url, side.headers, clients, per_client))
            if side.relay_pid:
                side.cpu_total += cpu_seconds(side.relay_pid) - before
            side.requests += requests


@contextlib.contextmanager
def unreserved_server(child_args: Sequence[str], general: int, log: Path) -> Iterator[str]:
    """A llama-server with the child's arguments but only its ``general`` slots (``-c`` scaled
    to keep each slot's context, no ``--slot-save-path``) on another port; yields its URL."""
    argv = list(child_args)
    slots = int(argv[argv.index("-np") + 1])
    ctx = int(argv[argv.index("-c") + 1])
    port = free_port()
    for flag, value in (("-np", general), ("-c", ctx // slots * general), ("--port", port)):
        argv[argv.index(flag) + 1] = str(value)
    save = argv.index("--slot-save-path")
    del argv[save : save + 2]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", process)
        yield url
    finally:
        stop_group(process, grace=10)


def set_native_args(home: Path, native: Sequence[str], model_id: str = "demo") -> None:
    """Give the model ``native`` llama-server arguments (its ``native_args`` option)."""
    manifest = home / "models" / f"{model_id}.json"
    record = json.loads(manifest.read_text())
    record["options"] = {**record.get("options", {}), "native_args": list(native)}
    manifest.write_text(json.dumps(record))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="rounds per side (default 30)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=50)
    parser.add_argument(
        "--burn", type=float, nargs="*", default=[], help="µs of CPU, one side each (none)"
    )
    parser.add_argument(
        "--sleep", type=float, nargs="*", default=[], help="µs of waiting, one side each (none)"
    )
    parser.add_argument(
        "--unreserved", action="store_true", help="a side: llama-server without the state slot"
    )
    parser.add_argument(
        "--native",
        nargs=argparse.REMAINDER,
        default=[],
        help="native llama-server arguments for the demo model (last on the line)",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp, contextlib.ExitStack() as stack:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home)
        if args.native:
            set_native_args(home, args.native)
        served = stack.enter_context(werk_serve(home, ["demo"], Path(tmp) / "serve.log"))
        with httpx.Client(base_url=served.url, timeout=120) as client:
            _post(client, CHAT)  # spawns the child
        child = managed_child(served.process.pid)
        port = int(child.url.rsplit(":", 1)[1])
        general = general_slots(child.args)
        pins = ",".join(map(str, general))
        auth = {"Authorization": f"Bearer {child.key}"}
        print(f"llama-server: {' '.join(child.args[child.args.index('-np') :])}")
        sides = {
            "werk": Side(served.url, {}, served.process.pid),
            "direct": Side(child.url, auth, None),
        }
        if args.unreserved:
            log = Path(tmp) / "unreserved.log"
            url = stack.enter_context(unreserved_server(child.args, len(general), log))
            sides["unreserved"] = Side(url, auth, None)
        extras: dict[str, tuple[str, ...]] = {"pinned": ()}
        extras |= {f"burn {us:g}": ("--burn-us", f"{us:g}") for us in args.burn}
        extras |= {f"sleep {us:g}": ("--sleep-us", f"{us:g}") for us in args.sleep}
        for name, extra in extras.items():
            relay = stack.enter_context(
                relay_process("minimal_relay.py", port, child.key, "--pin-slots", pins, *extra)
            )
            sides[name] = Side(relay.url, {}, relay.pid)
        print(
            f"concurrent: {args.clients} clients x {args.per_client} short chats, "
            f"{args.rounds} rounds per side, {len(sides)} sides (interleaved)"
        )
        measure(sides, args.rounds, args.clients, args.per_client)
    pinned = statistics.median(sides["pinned"].rates)
    direct = statistics.median(sides["direct"].rates)
    print(f"  {'side':10} {'req/s':>7} {'÷ pinned':>9} {'÷ direct':>9} {'relay CPU/request':>18}")
    for name, side in sides.items():
        rate = statistics.median(side.rates)
        ms = side.cpu_ms()
        cpu = "—" if ms is None else f"{ms:.3f} ms"
        print(f"  {name:10} {rate:7.1f} {rate / pinned:9.3f} {rate / direct:9.3f} {cpu:>18}")
    werk_ratio = statistics.median(sides["werk"].rates) / pinned
    extra_us = ((sides["werk"].cpu_ms() or 0.0) - (sides["pinned"].cpu_ms() or 0.0)) * 1e3
    print(
        f"Werk's relay CPU per request over the pinned relay's: {extra_us:+.0f} µs "
        f"(Werk ÷ pinned {werk_ratio:.3f} in req/s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
