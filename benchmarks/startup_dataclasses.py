"""How much of ``werk serve``'s start-up is creating dataclasses.

Imports, in a fresh interpreter, the modules ``werk serve`` imports on the way to a llama.cpp
model's first token (the serve command, the control service, the HTTP app and server, the
llama.cpp plugin's process, requirement and proxy layers), with ``dataclasses``' class
processing timed; prints how many dataclasses were created, the time they took, the modules
that took most, and the cost of one frozen five-field dataclass on this CPU for scale.
Figures are printed, never asserted. Run:
``.venv/bin/python benchmarks/startup_dataclasses.py [--top 10]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import statistics
import time
from typing import Any

START_PATH = (
    "werk.cli.serve",
    "werk.control.service",
    "werk.http.app",
    "werk.http.server",
    "werk_llamacpp.plugin",
    "werk_llamacpp.process",
    "werk_llamacpp.requirement",
    "werk_llamacpp.proxy",
)


def one_frozen_dataclass() -> float:
    start = time.perf_counter()

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Five:
        """Five fields."""

        a: int = 0
        b: str = ""
        c: float = 0.0
        d: int = 1
        e: int = 2

    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    process = dataclasses._process_class  # type: ignore[attr-defined]
    by_module: dict[str, list[float]] = {}

    def timed(cls: type, *rest: Any, **options: Any) -> Any:
        start = time.perf_counter()
        result = process(cls, *rest, **options)
        by_module.setdefault(cls.__module__, []).append(time.perf_counter() - start)
        return result

    dataclasses._process_class = timed  # type: ignore[attr-defined]
    start = time.perf_counter()
    for module in START_PATH:
        importlib.import_module(module)
    imports = time.perf_counter() - start
    dataclasses._process_class = process  # type: ignore[attr-defined]
    count = sum(len(t) for t in by_module.values())
    total = sum(sum(t) for t in by_module.values())
    print(f"importing {len(START_PATH)} modules of the start path: {imports * 1e3:.0f} ms")
    print(f"  {count} dataclasses created in {total * 1e3:.1f} ms")
    ranked = sorted(by_module.items(), key=lambda kv: -sum(kv[1]))[: args.top]
    for module, times in ranked:
        print(f"  {sum(times) * 1e3:6.1f} ms  {len(times):3d}  {module}")
    single = statistics.median(one_frozen_dataclass() for _ in range(50))
    print(f"one frozen dataclass with five fields: {single * 1e3:.2f} ms (median of 50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
