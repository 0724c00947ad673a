"""`werk serve` start to first token, this tree against another one, alternating.

A start-up change of 10-30 ms is below what separate runs of ``llamacpp_cold_start.py`` can
resolve on a shared 2-core machine (its medians move by 50 ms between runs). This benchmark
alternates the two code bases in one sitting: each round starts ``werk serve --model demo``
(the tiny generated demo, one ``WERK_HOME``) once with ``--before``'s sources first on
``PYTHONPATH`` and once with this tree's, waits for ``/werk/v1/health``, streams one chat and
records the first content chunk and the CPU time ``werk serve`` itself used up to it (from
``/proc``; its children not included). Medians per side are printed.

``--before`` is a checkout of the other commit, e.g. ``git worktree add /tmp/before COMMIT``;
compile its bytecode first (``python -m compileall -q /tmp/before/werk /tmp/before/plugins``)
when ``PYTHONDONTWRITEBYTECODE`` is set, as on this machine, or it pays for compiling.

Run: ``.venv/bin/python benchmarks/serve_start_ab.py --before /tmp/before [--rounds 10]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import httpx
from llamacpp_cold_start import first_token
from llamacpp_proxy_overhead import cpu_seconds, create_demo, werk_serve

PLUGINS = ("werk-llamacpp", "werk-vllm", "werk-omlx", "werk-media")


def one_start(home: Path, log: Path, pythonpath: str | None) -> tuple[float, float]:
    if pythonpath is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath
    with httpx.Client(timeout=600) as client, werk_serve(home, ["demo"], log, client) as served:
        token = first_token(client, served.url, {}) - served.started
        return token, cpu_seconds(served.process.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other source tree")
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    before = args.before.resolve()
    path = os.pathsep.join([str(before), *(str(before / "plugins" / p) for p in PLUGINS)])
    results: dict[str, list[tuple[float, float]]] = {"before": [], "this tree": []}
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home)
        one_start(home, Path(tmp) / "warm.log", None)  # the file cache and the inspections
        for round_ in range(args.rounds):
            for side, pythonpath in (("before", path), ("this tree", None)):
                token, cpu = one_start(home, Path(tmp) / f"{side}-{round_}.log", pythonpath)
                results[side].append((token, cpu))
                print(f"round {round_ + 1} {side:9}: first token {token:.3f} s, cpu {cpu:.2f} s")
    for side, runs in results.items():
        tokens = [t for t, _ in runs]
        print(
            f"{side:9}: first token median {statistics.median(tokens):.3f} s "
            f"(min {min(tokens):.3f}), werk serve cpu median "
            f"{statistics.median(c for _, c in runs):.2f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
