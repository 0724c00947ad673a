"""Where ``werk serve``'s start goes: a timeline of one start, from the spawn to the first token.

Runs ``werk serve --model demo`` (the tiny generated demo, one ``WERK_HOME``) under a small
bootstrap that records, without changing Werk's code, when the main steps begin and end: the
imports of the modules that matter (an import hook) and a few calls (wrapped after their module
is imported): the preload, the memory requirement, the spawn, the readiness port check, the
HTTP app. Each run waits for ``/werk/v1/health``, streams one chat, and prints the steps in the
order they happened, in seconds since the spawn, with the thread they ran in; ``--runs`` > 1
prints the median of each step over the runs. The wrapping costs a little itself (a few ms).

Run: ``.venv/bin/python benchmarks/serve_start_timeline.py [--runs 5]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from llamacpp_cold_start import first_token
from llamacpp_proxy_overhead import create_demo, werk_serve

BOOTSTRAP = r"""
import functools, importlib.abc, importlib.util, json, os, sys, threading, time
T0 = float(os.environ["WERK_TIMELINE_T0"])
OUT = open(os.environ["WERK_TIMELINE_OUT"], "a", buffering=1)  # a line per step: the server
def mark(what):  # is stopped by a signal, so nothing may wait for its exit to be written
    OUT.write(json.dumps([time.time() - T0, what, threading.current_thread().name]) + "\n")
WRAP = {  # module -> (owner, attribute) to time; owner "" is the module
    "werk.control.service": [("LocalControlService", "preload")],
    "werk.control.runtimes": [("RuntimeManager", "_requirement")],
    "werk.supervise": [("SupervisedProcess", "spawn"), ("", "listens_on")],
    "werk_llamacpp.process": [("", "start_runtime"), ("", "verify_unchanged")],
    "werk.http.app": [("", "build_app")],
}
IMPORTS = set(WRAP) | {"werk.cli.serve", "werk.plugins", "anyio._backends._asyncio",
                       "werk.http.server"}
def timed(function, name):
    if isinstance(function, classmethod):
        return classmethod(timed(function.__func__, name))
    if hasattr(function, "__code__") and function.__code__.co_flags & 0x80:  # a coroutine
        @functools.wraps(function)
        async def run(*args, **kwargs):
            mark(name + " >")
            try:
                return await function(*args, **kwargs)
            finally:
                mark(name + " <")
        return run
    @functools.wraps(function)
    def call(*args, **kwargs):
        mark(name + " >")
        try:
            return function(*args, **kwargs)
        finally:
            mark(name + " <")
    return call
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in IMPORTS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module
        def exec_module(module):
            mark("import " + name + " >")
            execute(module)
            mark("import " + name + " <")
            for owner, attr in WRAP.get(name, ()):
                holder = getattr(module, owner) if owner else module
                raw = holder.__dict__[attr] if owner else getattr(holder, attr)
                label = (owner + "." if owner else "") + attr
                setattr(holder, attr, timed(raw, label))
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Hook())
mark("interpreter started")
sys.argv[0] = "werk"
from werk.cli import main
mark("werk.cli imported")
main()
"""


def one_start(home: Path, work: Path, run: int) -> dict[str, tuple[float, str]]:
    out = work / f"timeline-{run}.jsonl"
    with httpx.Client(timeout=600) as client:
        started = time.time()  # the bootstrap's zero: ~0.1 ms before the spawn itself
        with werk_serve(
            home,
            ["demo"],
            work / f"serve-{run}.log",
            client,
            program=[sys.executable, "-c", BOOTSTRAP],
            extra_env={"WERK_TIMELINE_T0": repr(started), "WERK_TIMELINE_OUT": str(out)},
        ) as served:
            health = time.perf_counter() - served.started
            token = first_token(client, served.url, {}) - served.started
    steps: dict[str, tuple[float, str]] = {}
    for line in out.read_text().splitlines():
        at, what, thread = json.loads(line)
        steps.setdefault(what, (at, thread))  # the first occurrence of each step
    steps["/werk/v1/health answered (client)"] = (health, "client")
    steps["first token (client)"] = (token, "client")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        create_demo(home)
        one_start(home, work, 0)  # caches (inspection, header facts) and the file cache warm
        runs = [one_start(home, work, run) for run in range(1, args.runs + 1)]

    def when(name: str) -> float:
        return statistics.median(r[name][0] for r in runs if name in r)

    names = sorted(set().union(*runs), key=when)
    label = f"median of {len(runs)} runs" if len(runs) > 1 else "one run"
    print(f"werk serve --model demo (tiny): seconds since the spawn, {label}")
    for name in names:
        thread = runs[0][name][1] if name in runs[0] else "?"
        print(f"  {when(name):6.3f}  {name}  [{thread}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
