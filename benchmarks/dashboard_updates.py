"""What the dashboard's live updates cost ``werk serve``: one server-sent events stream against
polling the seven routes the page shows, measured in one run.

A ``werk serve`` with the llama.cpp demo model loaded serves the page. For ``--seconds`` each,
this script measures the server's CPU time (``/proc``, via psutil) while (a) nobody watches,
(b) one ``/dashboard/events`` stream is open (one snapshot every 2 s), (c) a client polls
``/werk/v1/capabilities``, ``memory``, ``models``, ``runtimes``, ``states``, ``stats`` and
``/v1/jobs`` every 2 s, as a polling page would. It prints CPU per update, bytes per update and
the number of access-log lines each way.

Run: ``.venv/bin/python benchmarks/dashboard_updates.py [--seconds 30]``
(needs the llama-server build: ``make llama-server``). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_proxy_overhead import WERK, werk_env, werk_serve

INTERVAL = 2.0
POLLED = (
    "/werk/v1/capabilities",
    "/werk/v1/memory",
    "/werk/v1/models",
    "/werk/v1/runtimes",
    "/werk/v1/states",
    "/werk/v1/stats",
    "/v1/jobs",
)


def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(process: psutil.Process, seconds: float, work: threading.Thread | None) -> float:
    before = cpu(process)
    if work is not None:
        work.start()
        work.join()
    else:
        time.sleep(seconds)
    return cpu(process) - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-dash-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        subprocess.run(
            [str(WERK), "models", "create-demo", "--id", "demo"],
            check=True,
            capture_output=True,
            env=werk_env(home),
        )
        with werk_serve(home, ["demo"], Path(tmp) / "serve.log") as served:
            server = psutil.Process(served.process.pid)
            with httpx.Client(base_url=served.url, timeout=60) as http:
                http.post("/werk/v1/models/demo/load", json={}).raise_for_status()
                idle = measure(server, args.seconds, None)
                streamed: list[int] = []

                def stream() -> None:
                    deadline = time.monotonic() + args.seconds
                    with http.stream("GET", "/dashboard/events") as events:
                        for line in events.iter_lines():
                            if line.startswith("data: "):
                                streamed.append(len(line))
                            if time.monotonic() > deadline:
                                break

                sse = measure(server, args.seconds, threading.Thread(target=stream))
                polled: list[int] = []

                def poll() -> None:
                    deadline = time.monotonic() + args.seconds
                    while time.monotonic() < deadline:
                        started = time.monotonic()
                        polled.append(sum(len(http.get(path).content) for path in POLLED))
                        time.sleep(max(0.0, INTERVAL - (time.monotonic() - started)))

                polling = measure(server, args.seconds, threading.Thread(target=poll))
    base = idle / args.seconds * INTERVAL  # the idle server's CPU in one interval
    print(f"werk serve CPU over {args.seconds:.0f} s: idle {idle * 1e3:.0f} ms, "
          f"one stream {sse * 1e3:.0f} ms, polling {polling * 1e3:.0f} ms")  # fmt: skip
    for name, used, sizes, lines in (
        ("one stream", sse, streamed, "1 access-log line per stream"),
        ("polling", polling, polled, f"{len(POLLED)} access-log lines per update"),
    ):
        per = (used / max(1, len(sizes)) - base) * 1e3
        size = sum(sizes) / max(1, len(sizes)) / 1024
        print(f"  {name}: {len(sizes)} updates, {per:.2f} ms CPU per update above idle, "
              f"{size:.1f} KiB per update, {lines}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
