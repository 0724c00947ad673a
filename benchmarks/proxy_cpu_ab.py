"""``werk serve``'s CPU time per ``/v1`` request: this tree against another one, side by side.

Two ``werk serve --model demo`` (tiny demo model) run at once, one from a ``--before`` checkout
(on ``PYTHONPATH``, with its plugins) and one from this tree, each with its own llama-server.
Requests alternate between them (before, this tree, this tree, before, …), so a machine whose
speed drifts by half within minutes (this 2-core one) slows both alike; each server's CPU time
(user + system, all threads, from ``/proc``) over the run is divided by its requests. Prints
that and each side's latency p50. A change of a few percent of Werk's per-request work shows
here when the single-server benchmark's latencies cannot resolve it.

Run::

    git worktree add /tmp/before <commit>
    .venv/bin/python -m compileall -q /tmp/before/werk /tmp/before/plugins
    .venv/bin/python benchmarks/proxy_cpu_ab.py --before /tmp/before [--requests 1000] [--stream]

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
from llamacpp_proxy_overhead import CHAT, _first_byte, _post, cpu_seconds, create_demo, werk_serve
from serve_start_ab import PLUGINS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other source tree")
    parser.add_argument("--requests", type=int, default=1000, help="per side, after 30 warm-up")
    parser.add_argument("--stream", action="store_true", help="streamed chats (first byte)")
    args = parser.parse_args(argv)
    before = args.before.resolve()
    path = os.pathsep.join([str(before), *(str(before / "plugins" / p) for p in PLUGINS)])
    body = {**CHAT, "stream": True}
    measure: Callable[[httpx.Client], float] = (
        (lambda c: _first_byte(c, body)) if args.stream else (lambda c: _post(c, CHAT))
    )
    sides = ("before", "this tree")
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp, contextlib.ExitStack() as stack:
        servers = {}
        for side in sides:
            home = Path(tmp) / side.replace(" ", "-")
            home.mkdir()
            create_demo(home)
            if side == "before":
                os.environ["PYTHONPATH"] = path
            else:
                os.environ.pop("PYTHONPATH", None)
            served = stack.enter_context(werk_serve(home, ["demo"], home / "serve.log"))
            client = stack.enter_context(httpx.Client(base_url=served.url, timeout=120))
            servers[side] = (served.process.pid, client)
        os.environ.pop("PYTHONPATH", None)
        for _, client in servers.values():
            for _ in range(30):  # spawns the child, warms both paths
                measure(client)
        cpu_start = {side: cpu_seconds(pid) for side, (pid, _) in servers.items()}
        latencies: dict[str, list[float]] = {side: [] for side in sides}
        for n in range(args.requests):
            for side in sides if n % 2 == 0 else sides[::-1]:
                latencies[side].append(measure(servers[side][1]))
        kind = "streamed (first content byte)" if args.stream else "non-streamed"
        print(f"{args.requests} {kind} short chats per side, alternating")
        for side, (pid, _) in servers.items():
            cpu = (cpu_seconds(pid) - cpu_start[side]) / args.requests
            p50 = statistics.median(latencies[side])
            print(
                f"  {side:9}: werk serve CPU per request {cpu * 1e3:.3f} ms, p50 {p50 * 1e3:.3f} ms"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
