"""Cold start: ``werk serve`` to first token vs ``llama-server`` alone to first token.

Each run starts from nothing and stops everything afterwards:

* **werk**: spawn ``werk serve --model demo`` at t0, wait for ``/werk/v1/health``, then stream
  one ``/v1/chat/completions``; the first SSE chunk carrying content is the first token (Werk
  preloads: its llama-server is spawned as the server starts, while Werk imports its HTTP stack,
  and a request that arrives before it is ready waits for it);
* **llama-server alone**: spawn the same executable at t0 with the argument list Werk used
  (recorded from Werk's child in a preliminary run, with a fresh port, key and slot directory),
  wait for ``/health``, stream the same chat.

Both use the same model file (the tiny generated demo unless ``--gguf``); the OS file cache is
warm for both after the preliminary run. Each side polls readiness every 5 ms and streams the
chat with one HTTP client made before its clock starts (until 2026-12-05 every poll built a
new client, ~20 ms of CPU each, taken from the 2-core machine being timed, and the chat's
client was built inside the timed span). Medians of ``--runs`` are printed with the ratio.

Run: ``.venv/bin/python benchmarks/llamacpp_cold_start.py [--runs 5] [--gguf PATH]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from llamacpp_proxy_overhead import (
    create_demo,
    free_port,
    import_model,
    managed_child,
    wait_http,
    werk_serve,
)

from werk.supervise import stop_group

CHAT = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 4,
    "temperature": 0,
    "stream": True,
}


def first_token(client: httpx.Client, url: str, headers: dict[str, str]) -> float:
    """Stream one chat; return the ``perf_counter`` time of the first content chunk."""
    with client.stream("POST", f"{url}/v1/chat/completions", json=CHAT, headers=headers) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    return time.perf_counter()
    raise RuntimeError("the stream ended without content")


def werk_run(home: Path, log: Path) -> tuple[float, float, list[str]]:
    # The client exists before the clock starts (building one costs ~20 ms of CPU) and serves
    # both the health polls and the chat, on both sides.
    with httpx.Client(timeout=600) as client, werk_serve(home, ["demo"], log, client) as served:
        ready = time.perf_counter() - served.started
        token = first_token(client, served.url, {}) - served.started
        args = managed_child(served.process.pid).args
    return ready, token, args


def direct_run(args: list[str], work: Path) -> tuple[float, float]:
    port, key = free_port(), secrets.token_hex(16)
    slots = work / f"slots-{port}"
    slots.mkdir(mode=0o700)
    argv = list(args)
    for flag, value in (("--port", str(port)), ("--api-key", key), ("--slot-save-path", slots)):
        argv[argv.index(flag) + 1] = str(value)
    client = httpx.Client(timeout=600)
    started = time.perf_counter()
    with (work / f"llama-{port}.log").open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", process, client=client)
        ready = time.perf_counter() - started
        token = first_token(client, url, {"Authorization": f"Bearer {key}"}) - started
    finally:
        client.close()
        # Werk's stop path: a llama-server that ignores SIGTERM is killed after 10 s, never
        # left running (it once did, and wait(timeout=60) raised with the child still alive).
        stop_group(process, grace=10)
    return ready, token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gguf", type=Path, help="serve this GGUF as 'demo' instead")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        work = Path(tmp)
        home = work / "home"
        home.mkdir()
        if args.gguf is not None:
            import_model(home, args.gguf.resolve(), "demo")
        else:
            create_demo(home)
        _, _, child_args = werk_run(home, work / "serve-0.log")  # warms the file cache
        print(f"llama-server arguments (Werk's): {' '.join(child_args[1:5])} …")
        werk: list[tuple[float, float]] = []
        direct: list[tuple[float, float]] = []
        failure: BaseException | None = None
        for run in range(args.runs):
            try:
                ready, token, _ = werk_run(home, work / f"serve-{run + 1}.log")
                direct_ready, direct_token = direct_run(child_args, work)
            except (Exception, KeyboardInterrupt) as exc:  # print what finished, then fail
                failure = exc
                print(f"run {run + 1} failed: {type(exc).__name__}: {exc}")
                break
            werk.append((ready, token))
            direct.append((direct_ready, direct_token))
            print(
                f"run {run + 1}: werk ready {ready:.3f} s, first token {token:.3f} s | "
                f"llama-server ready {direct_ready:.3f} s, first token {direct_token:.3f} s"
            )
        if not werk:
            raise SystemExit(f"no run finished ({failure!r})")
        w_ready = statistics.median(r for r, _ in werk)
        w_token = statistics.median(t for _, t in werk)
        d_ready = statistics.median(r for r, _ in direct)
        d_token = statistics.median(t for _, t in direct)
        print(f"median werk serve: ready {w_ready:.3f} s, first token {w_token:.3f} s")
        print(f"median llama-server alone: ready {d_ready:.3f} s, first token {d_token:.3f} s")
        print(
            f"first token: werk adds {w_token - d_token:+.3f} s, ratio werk/direct "
            f"{w_token / d_token:.2f}"
        )
        if failure is not None:
            print(f"only {len(werk)} of {args.runs} runs finished")
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
