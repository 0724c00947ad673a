"""Chat resume: first-token time of a resumed long conversation, with and without its snapshot.

Real ``werk run --session`` processes on the local llama.cpp route (each one starts its own
llama-server, as a terminal user's does) with the *medium* generated demo model:

1. the model: ``create_demo_model(size="medium")``, cached under ``--model-cache`` (default
   ``$TMPDIR/werk-bench-models``, reused by later runs) and imported into a temporary
   ``WERK_HOME``;
2. the history: one ``werk run --session bench`` whose first message is ``--tokens`` (1,800)
   tokens long builds the conversation and, after its complete reply, its native KV snapshot;
   the session directory is then copied aside;
3. each round puts that copy back twice and resumes it with the same question:
   **with** the snapshot (``native/`` kept: the first request verifies and restores it), and
   **without** it (``native/`` removed: the whole conversation is evaluated again).

First-token time is measured from spawning ``werk run`` to the first byte of the reply on its
stdout: the whole local path (process start, llama-server start and model load, restore or
prefill, first token). Werk's own ``-v`` phases are printed with it (restore time, the backend's
cached-token count). Medians over ``--repeat`` rounds and the ratio without/with are printed.

Run: ``.venv/bin/python benchmarks/chat_resume.py [--tokens 1800] [--repeat 2]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from llamacpp_prefix_value import long_prompt
from llamacpp_proxy_overhead import WERK, import_model, werk_env
from werk_llamacpp.demo import create_demo_model

MODEL = "medium"
SESSION = "bench"
SAMPLING = ("--temperature", "0", "--seed", "1", "--max-tokens", "4")
QUESTION = "Please summarise what I wrote above in one short sentence."
PHASE = re.compile(r"^werk: \[\s*([\d.]+)s\] (.*)$")
CACHED = re.compile(r"usage prompt (\d+), completion \d+, cached (\d+)")


@dataclass
class Resumed:
    first_byte_s: float
    total_s: float
    phases: list[tuple[float, str]]
    reply: str

    def phase(self, prefix: str) -> tuple[float, str] | None:
        return next(((t, p) for t, p in self.phases if p.startswith(prefix)), None)

    def summary(self) -> str:
        usage = next((CACHED.search(p) for _, p in self.phases if CACHED.search(p)), None)
        restore = [p for _, p in self.phases if "tokens restored into slot" in p]
        parts = [f"first byte {self.first_byte_s:6.2f} s (process {self.total_s:6.2f} s)"]
        first = self.phase("first token received")
        if first is not None:
            parts.append(f"werk's first-token phase at {first[0]:.2f} s")
        if usage is not None:
            parts.append(f"prompt {usage.group(1)} tokens, cached {usage.group(2)}")
        if restore:
            parts.append(restore[0].split(";")[0])
        if self.phase("native KV restored reuse observed") is not None:
            parts.append("reuse observed")
        return "; ".join(parts)


def cached_model(cache: Path) -> Path:
    path = cache / "demo-medium-seed0.gguf"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        create_demo_model(path, seed=0, size="medium")
        print(f"generated {path} in {time.perf_counter() - start:.1f} s")
    return path


def werk_run(home: Path, prompt: str) -> Resumed:
    """``werk run MODEL PROMPT --session bench -v``; times the first stdout byte."""
    start = time.perf_counter()
    process = subprocess.Popen(
        [str(WERK), "run", MODEL, prompt, "--session", SESSION, "-v", *SAMPLING],
        env={**werk_env(home), "WERK_LOAD_PLUGINS": "werk-llamacpp"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    stderr_pipe = process.stderr
    err: list[bytes] = []
    drain = threading.Thread(target=lambda: err.append(stderr_pipe.read()))
    drain.start()
    first = process.stdout.read(1)
    first_byte = time.perf_counter() - start
    rest = process.stdout.read()
    code = process.wait()
    total = time.perf_counter() - start
    drain.join()
    stderr = b"".join(err).decode(errors="replace")
    if code != 0 or not first:
        raise RuntimeError(f"werk run exited {code}:\n{stderr}")
    phases = [(float(m.group(1)), m.group(2)) for m in map(PHASE.match, stderr.splitlines()) if m]
    return Resumed(first_byte, total, phases, (first + rest).decode(errors="replace"))


def put_back(backup: Path, session: Path, *, keep_native: bool) -> None:
    shutil.rmtree(session)
    shutil.copytree(backup, session, symlinks=True)
    if not keep_native:
        shutil.rmtree(session / "native")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1800, help="length of the history")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--model-cache", type=Path, default=Path(tempfile.gettempdir()) / "werk-bench-models"
    )
    args = parser.parse_args(argv)
    gguf = cached_model(args.model_cache)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        import_model(home, gguf, MODEL)
        built = werk_run(home, long_prompt(args.tokens, seed=1))
        print(f"history built (cold, full prefill): {built.summary()}")
        saved = [p for _, p in built.phases if p.startswith("native KV snapshot: saved")]
        print(f"  {saved[0] if saved else 'NO SNAPSHOT WAS SAVED'}")
        session = home / "chat-sessions" / SESSION
        backup = Path(tmp) / "backup"
        shutil.copytree(session, backup, symlinks=True)
        with_snapshot: list[float] = []
        without: list[float] = []
        for round_ in range(1, args.repeat + 1):
            for keep, bucket, label in ((True, with_snapshot, "with"), (False, without, "without")):
                put_back(backup, session, keep_native=keep)
                resumed = werk_run(home, QUESTION)
                bucket.append(resumed.first_byte_s)
                print(f"round {round_} {label:>7} snapshot: {resumed.summary()}")
        with_s, without_s = statistics.median(with_snapshot), statistics.median(without)
        print(
            f"first-token time of the resumed conversation (median of {args.repeat}, "
            f"{os.cpu_count()} CPUs): with snapshot {with_s:.2f} s, without {without_s:.2f} s"
        )
        print(f"ratio without/with {without_s / with_s:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
