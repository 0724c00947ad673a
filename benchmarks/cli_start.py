"""CLI start-up: wall time of ``werk --help``, ``werk plugins`` and ``werk models list``.

Each command runs ``--runs`` times (after one untimed run that writes the bytecode caches) in a
temporary ``WERK_HOME`` holding one imported demo model, with every installed plugin loaded;
``python -c pass`` with the same interpreter is the floor. Medians are printed with the goal
from issue 15 (0.15 s each). ``python -X importtime -c "import werk.cli"`` shows what the
imports cost (summarised in docs/performance.md).

Run: ``.venv/bin/python benchmarks/cli_start.py [--runs 11]``. Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
GOAL_SECONDS = 0.15


def timed(argv: list[str], env: dict[str, str], runs: int) -> float:
    subprocess.run(argv, env=env, check=True, capture_output=True)  # bytecode caches, warm disk
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("WERK_HOME", "WERK_LOAD_PLUGINS")}
        env["WERK_HOME"] = str(Path(tmp) / "home")
        werk = str(BIN / "werk")
        demo = [werk, "models", "create-demo", "--id", "demo"]
        subprocess.run(demo, env=env, check=True, capture_output=True)
        floor = timed([sys.executable, "-c", "pass"], env, args.runs)
        print(f"median of {args.runs} runs (goal <= {GOAL_SECONDS:.2f} s each)")
        print(f"  {'python -c pass':<20} {floor:6.3f} s")
        for command in (["--help"], ["plugins"], ["models", "list"]):
            seconds = timed([werk, *command], env, args.runs)
            met = "met" if seconds <= GOAL_SECONDS else "not met"
            label = "werk " + " ".join(command)
            print(f"  {label:<20} {seconds:6.3f} s  ({seconds / floor:4.1f}x the floor; {met})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
