"""In-process llama.cpp (``llamacpp-inproc``) against a supervised ``llama-server``
(``llamacpp``), the same GGUF file, one ``werk serve``, interleaved requests, one run.

Three measures, each a median over ``--rounds`` requests per backend, alternating backends:

1. **short chat**: a one-line chat, ``max_tokens`` 8, the same prompt every time (both backends
   reuse the whole prompt: this is the per-request cost of the path, hop included);
2. **shared system prompt**: a chat with a ``--system``-word system prompt and a new user line
   each round (both reuse the system prompt: llama-server's ``cache_prompt``, the in-process
   session reuse), ``max_tokens`` 8; the reply's ``cached_tokens`` is printed;
3. **load**: the first request after start (model load, plus Werk's functional probes the
   in-process backend runs while loading; llama-server's probe runs in the background).

Ratios are in-process ÷ llama-server (below 1: in-process is faster). Needs the llama-server
build (``make llama-server``) and ``werk backends install llamacpp-inproc``
(``WERK_BACKENDS_DIR`` as ``make test`` sets it is honoured).

Run: ``WERK_BACKENDS_DIR=$HOME/.cache/werk/backends .venv/bin/python benchmarks/llamacpp_inproc.py
[--size tiny|medium] [--gguf PATH] [--rounds 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from llamacpp_proxy_overhead import WERK, create_demo, werk_env, werk_serve

SERVER, INPROC = "demo", "demo-inproc"


def chat(client: httpx.Client, model: str, system: str, user: str) -> tuple[float, int]:
    messages = [{"role": "user", "content": user}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}
    started = time.perf_counter()
    answer = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - started
    if answer.status_code != 200:
        raise RuntimeError(f"{model}: HTTP {answer.status_code}: {answer.text}")
    usage: dict[str, Any] = answer.json()["usage"]
    return elapsed, int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=("tiny", "medium"))
    parser.add_argument("--gguf", type=Path, help="a demo GGUF made earlier (skips generating)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--system", type=int, default=150, help="system prompt words")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="werk-inproc-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if args.gguf is None:
            create_demo(home, SERVER, args.size)
            gguf = home / "models" / "files" / f"{SERVER}.gguf"
        else:
            gguf = args.gguf.absolute()
            subprocess.run(
                [str(WERK), "models", "import", str(gguf), "--id", SERVER],
                check=True, capture_output=True, env=werk_env(home),
            )  # fmt: skip
        subprocess.run(
            [str(WERK), "models", "import", str(gguf), "--id", INPROC,
             "--backend", "llamacpp-inproc"],
            check=True, capture_output=True, env=werk_env(home),
        )  # fmt: skip
        system = " ".join(["The assistant answers briefly and precisely."] * (args.system // 6))
        log = Path(tmp) / "serve.log"
        with (
            httpx.Client(timeout=600) as client,
            werk_serve(home, [SERVER, INPROC], log, args=["--no-preload"]) as served,
        ):
            client.base_url = httpx.URL(served.url)
            print(f"{gguf.name} ({gguf.stat().st_size / 1e6:.1f} MB), {args.rounds} rounds")
            load = {model: chat(client, model, "", "hello")[0] for model in (SERVER, INPROC)}
            short: dict[str, list[float]] = {SERVER: [], INPROC: []}
            shared: dict[str, list[float]] = {SERVER: [], INPROC: []}
            cached: dict[str, list[int]] = {SERVER: [], INPROC: []}
            for model in (SERVER, INPROC):  # warm-up: the system prompt once each
                chat(client, model, system, "warm up")
            for round_ in range(args.rounds):
                for model in (SERVER, INPROC) if round_ % 2 == 0 else (INPROC, SERVER):
                    short[model].append(chat(client, model, "", "hello")[0])
                    elapsed, reused = chat(client, model, system, f"Question {round_}?")
                    shared[model].append(elapsed)
                    cached[model].append(reused)

    def row(name: str, server: float, inproc: float) -> None:
        print(
            f"  {name:<22} llama-server {server * 1e3:9.1f} ms   in-process {inproc * 1e3:9.1f}"
            f" ms   ratio {inproc / server:5.2f}"
        )

    print("medians (in-process ÷ llama-server):")
    for name, values in (("short chat", short), ("shared system prompt", shared)):
        row(name, statistics.median(values[SERVER]), statistics.median(values[INPROC]))
    row("first request (load)", load[SERVER], load[INPROC])
    for model in (SERVER, INPROC):
        print(f"  cached tokens {model:<12} median {statistics.median(cached[model]):.0f}")


if __name__ == "__main__":
    main()
