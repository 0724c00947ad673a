"""Relay overhead of Werk's ``/v1`` in front of a real vLLM server vs that server directly.

A vLLM OpenAI server (the CPU build from ``werk backends install vllm``) serves the tiny
generated demo model (``werk models create-demo --kind vllm``) on loopback, started by this
script as a separately operated endpoint would be; ``werk serve`` serves it as a
``vllm-remote`` model (``WERK_VLLM_HOST``/``WERK_VLLM_PORT``; Werk adds its per-key
``cache_salt`` and renames the endpoint's model to Werk's id). The same short chat goes both
ways, measured as ``benchmarks/llamacpp_proxy_overhead.py`` does (its helpers are used):
interleaved sequential non-streamed requests (added p50), streamed requests (added p50 to the
first content byte), and ``--clients`` concurrent clients (median req/s ratio Werk/direct), then
the goal table. The concurrent rounds also measure two control relays in front of the same
server (``benchmarks/controls.py``; ``--no-control`` leaves them out): a byte-for-byte one and
the least a Python HTTP relay on Werk's stack does; and the server directly once more as a side
of its own (``again``), whose ratio to direct, where nothing differs, is the spread of that
comparison in this run.

Run: ``.venv/bin/python benchmarks/vllm_relay_overhead.py [--rounds 200] [--clients 8]``
(``WERK_BACKENDS_DIR`` or ``--backends`` names where vLLM's environment is; ``make vllm-env``
builds it under ``~/.cache/werk/backends``). Figures are printed, never asserted; ``--json PATH``
writes the goal table as JSON too, and ``benchmarks/repeat_goals.py vllm_relay_overhead`` runs
the benchmark several times and prints the table on the medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from controls import control_relays
from llamacpp_proxy_overhead import (
    CHAT,
    WERK,
    Goal,
    concurrent_rounds,
    free_port,
    print_goals,
    sequential,
    streamed,
    werk_env,
    werk_serve,
)

WERK_ID, UPSTREAM_ID = "far-vllm", "upstream-tiny"
GOALS: tuple[Goal, ...] = (
    ("vLLM relay: added p50, short non-streamed chat", "ms", 1.0, "<="),
    ("vLLM relay: added time to first streamed byte", "ms", 1.0, "<="),
    ("vLLM relay: 8 clients req/s / direct", "", 0.95, ">="),
)


def start_vllm(python: Path, model: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    argv = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", UPSTREAM_ID,
        "--enable-prefix-caching", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 300
    while True:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited; log tail:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return process, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("vLLM did not become ready in 300 s")
        time.sleep(0.5)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=25)
    parser.add_argument("--concurrent-rounds", type=int, default=9)
    parser.add_argument(
        "--backends",
        default=os.environ.get("WERK_BACKENDS_DIR", str(Path.home() / ".cache/werk/backends")),
        help="where `werk backends install vllm` put vLLM's environment",
    )
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="no control relays and no second direct side (again) in the concurrent rounds",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the goal table to PATH as JSON")
    args = parser.parse_args(argv)
    python = Path(args.backends) / "vllm" / "venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no vLLM environment at {python.parent.parent}: run `make vllm-env`")
    with tempfile.TemporaryDirectory(prefix="werk-bench-vllm-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        env = {**werk_env(home), "WERK_BACKENDS_DIR": args.backends}
        for command in (
            ["models", "create-demo", "--kind", "vllm", "--id", "tiny-vllm"],
            ["models", "import", "--backend", "vllm-remote", "--id", WERK_ID],
        ):
            subprocess.run([str(WERK), *command], check=True, capture_output=True, env=env)
        model = home / "models" / "files" / "tiny-vllm"
        vllm, port = start_vllm(python, model, Path(tmp) / "vllm.log")
        try:
            extra = {
                "WERK_BACKENDS_DIR": args.backends,
                "WERK_VLLM_HOST": "127.0.0.1",
                "WERK_VLLM_PORT": str(port),
            }
            werk_body = {**CHAT, "model": WERK_ID}
            direct_body = {**CHAT, "model": UPSTREAM_ID}
            direct_url = f"http://127.0.0.1:{port}"
            with werk_serve(home, [WERK_ID], Path(tmp) / "serve.log", extra_env=extra) as served:
                print(f"vLLM pid {vllm.pid} on port {port}; werk serve pid {served.process.pid}")
                with (
                    httpx.Client(base_url=served.url, timeout=120) as werk,
                    httpx.Client(base_url=direct_url, timeout=120) as direct,
                ):
                    werk.post("/v1/chat/completions", json=werk_body).raise_for_status()
                    pid = served.process.pid
                    bodies = {"werk_body": werk_body, "direct_body": direct_body}
                    added, _ = sequential(werk, direct, args.rounds, args.warmup, pid, **bodies)
                    first = streamed(werk, direct, args.rounds, args.warmup, pid, **bodies)
                with control_relays(port, enabled=not args.no_control) as relays:
                    throughput = concurrent_rounds(
                        (served.url, {}, werk_body),
                        (direct_url, {}, direct_body),
                        rounds=args.concurrent_rounds,
                        clients=args.clients,
                        per_client=args.per_client,
                        controls=[(name, (url, {}, direct_body)) for name, url in relays.items()],
                        same_server=not args.no_control,
                    )
        finally:
            stop(vllm)
    print_goals(GOALS, (added, first, throughput.ratio), throughput, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
