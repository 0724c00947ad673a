"""Run a relay benchmark several times and print its goal table on the medians of the runs.

One run of ``benchmarks/llamacpp_proxy_overhead.py`` or ``benchmarks/vllm_relay_overhead.py``
cannot settle a throughput ratio on a 2-core machine: the direct server measured twice in one
run (the benchmarks' ``again`` side) read 0.88--1.20 of itself in nine-round runs. This runs the
benchmark ``--runs`` times, one after another (each run's whole output goes to a log file),
then prints every goal's value in each run, the median, whether the median meets the goal and
how many single runs met it, and each run's ``again`` / direct. Nothing is asserted.

Run: ``.venv/bin/python benchmarks/repeat_goals.py llamacpp_proxy_overhead --runs 5 [-- ARGS]``
(``ARGS`` go to every run of the benchmark, e.g. ``-- --concurrent-rounds 15``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_proxy_overhead import Goal, goal_line

HERE = Path(__file__).parent
BENCHMARKS = ("llamacpp_proxy_overhead", "vllm_relay_overhead")


def run_once(benchmark: str, args: list[str], log: Path, table: Path) -> dict[str, Any]:
    """One run of ``benchmark``; its goal table as the benchmark wrote it (``--json``)."""
    argv = [sys.executable, str(HERE / f"{benchmark}.py"), *args, "--json", str(table)]
    with log.open("wb") as out:
        code = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0 or not table.exists():
        tail = log.read_text(errors="replace")[-2000:]
        raise SystemExit(f"{benchmark} exited {code}; its log ({log}) ends:\n{tail}")
    result: dict[str, Any] = json.loads(table.read_text())
    return result


def summary(runs: list[dict[str, Any]]) -> list[str]:
    """The goal table over ``runs``: per goal the median (met or not on it), how many runs met
    it and every run's value; then every run's ``again`` / direct."""
    lines = [f"goals over {len(runs)} runs (the median of the runs' values):"]
    for index, row in enumerate(runs[0]["goals"]):
        goal: Goal = (row["name"], row["unit"], row["goal"], row["way"])
        values = [run["goals"][index]["value"] for run in runs]
        met = sum(run["goals"][index]["met"] for run in runs)
        shown = " ".join(f"{v:+.3f}" if row["unit"] else f"{v:.3f}" for v in values)
        lines.append(f"  {goal_line(goal, statistics.median(values), 'median ')}")
        lines.append(f"    single runs met it {met} of {len(runs)}: {shown}")
    same = [run["same_server"] for run in runs if run["same_server"] is not None]
    if same:
        lines.append(
            f"  direct measured twice (again / direct), each run: "
            f"{' '.join(f'{v:.3f}' for v in same)} (nothing differs; 1 would be no noise)"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Arguments after -- go to every run of the benchmark.",
    )
    parser.add_argument("benchmark", choices=BENCHMARKS)
    parser.add_argument("--runs", type=int, default=5, help="how many runs (default 5)")
    parser.add_argument("--logs", help="where each run's output goes (default: a new temp dir)")
    options = parser.parse_args(ours)
    if options.runs < 1:
        parser.error("--runs must be at least 1")
    logs = Path(options.logs or tempfile.mkdtemp(prefix="werk-repeat-goals-"))
    logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for number in range(1, options.runs + 1):
        log, table = logs / f"run{number}.log", logs / f"run{number}.json"
        table.unlink(missing_ok=True)
        started = time.monotonic()
        runs.append(run_once(options.benchmark, args, log, table))
        took = time.monotonic() - started
        print(f"run {number}/{options.runs}: {took:.0f} s, output in {log}", flush=True)
    print("\n".join(summary(runs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
