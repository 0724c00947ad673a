"""Persisted ``/v1`` chat turns on one running server: continuing the live state the
conversation's state was written from, against restoring that state's disk copy.

``werk serve`` with the llama.cpp medium demo model (one state slot). Two conversations of the
same shape (a system prompt, then questions of equal length), each turn a ``/v1`` chat with
``"werk": {"persist": true}``, one conversation after the other. **live**: each turn continues
the state slot the previous reply was decoded in (nothing read from disk; ``restored_tokens``
null). **disk**: before each turn another prompt's prefill takes the state slot, so the turn
restores the conversation's state from disk (read, SHA-256 verified, copied, loaded by
llama-server) — what every turn cost before live states were continued, and what a turn still
costs after a restart or when another conversation had the slot. The eviction is not timed.
``--rounds`` conversations of each kind run, the kinds taking turns (live first, then disk
first, …), so that drift of the machine falls on both. Each row: the turn's prompt tokens, the
tokens it evaluated, and the median wall time of the whole turn (prefill, a
``--reply-tokens`` decode, keeping the state with its reply) both ways.

Run: ``.venv/bin/python benchmarks/persisted_chat_turns.py [--turns 8] [--size medium]
[--reply-tokens 8] [--rounds 3]`` (needs the llama-server build: ``make llama-server``).
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from chat_continuation import QUESTION, SYSTEM, wait_for_proof
from llamacpp_proxy_overhead import create_demo, werk_serve

PERSIST = {"persist": True, "allow_experimental": True}


def turn(client: httpx.Client, messages: list[dict[str, str]], reply_tokens: int) -> Any:
    body = {
        "model": "demo",
        "messages": messages,
        "max_tokens": reply_tokens,
        "temperature": 0,
        "werk": PERSIST,
    }
    started = time.perf_counter()
    answer = client.post("/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return seconds, answer.json()


def evict(client: httpx.Client, n: int) -> None:
    """Another prompt's prefill and decode in the one state slot (not timed)."""
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": f"Something else, number {n}."}],
        "allow_experimental": True,
        "policy": {"retention": "ephemeral", "reuse": "disabled"},
    }
    prefilled = client.post("/werk/v1/prefill", json=body, timeout=600)
    prefilled.raise_for_status()
    token = prefilled.json()["handoff"]["token"]
    client.post("/werk/v1/decode", json={"handoff": token, "max_tokens": 1}, timeout=600)


def conversation(
    client: httpx.Client, name: str, round_: int, args: argparse.Namespace
) -> list[tuple[int, float, Any]]:
    """One conversation's turns, back to back (``disk``: the state slot taken before each)."""
    messages = [{"role": "system", "content": f"{name} {round_}: {SYSTEM}"}]
    turns = []
    for n in range(1, args.turns + 1):
        messages.append({"role": "user", "content": QUESTION.format(n=n)})
        if name == "disk":
            evict(client, n)
        seconds, answer = turn(client, messages, args.reply_tokens)
        messages.append(
            {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
        )
        turns.append((n, seconds, answer))
    return turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--size", default="medium")
    parser.add_argument("--reply-tokens", type=int, default=8, help="each reply's max_tokens")
    parser.add_argument(
        "--rounds", type=int, default=3, help="conversations per mode (the modes take turns)"
    )
    args = parser.parse_args(argv)
    rows: list[tuple[int, int, int, float, float, Any]] = []
    timed: dict[str, list[list[tuple[int, float, Any]]]] = {"live": [], "disk": []}
    with tempfile.TemporaryDirectory(prefix="werk-bench-turns-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home, "demo", args.size)
        log = Path(tmp) / "serve.log"
        with werk_serve(home, ["demo"], log) as served, httpx.Client(base_url=served.url) as c:
            turn(c, [{"role": "user", "content": "Warm up."}], 1)  # the probe runs here
            wait_for_proof(c)
            for r in range(args.rounds):  # live first, then disk first, ...
                for name in ("live", "disk") if r % 2 == 0 else ("disk", "live"):
                    timed[name].append(conversation(c, name, r, args))
    for n in range(2, args.turns + 1):
        live = [turns[n - 1] for turns in timed["live"]]
        disk = [turns[n - 1] for turns in timed["disk"]]
        restored = (
            {t[2]["werk"]["reuse"]["restored_tokens"] for t in live},
            {t[2]["werk"]["reuse"]["restored_tokens"] for t in disk},
        )
        answer = live[0][2]
        prompt, new = answer["usage"]["prompt_tokens"], answer["werk"]["evaluated_tokens"]
        live_s = statistics.median(t[1] for t in live)
        disk_s = statistics.median(t[1] for t in disk)
        rows.append((n, prompt, new, live_s, disk_s, restored))
    print(f"{'turn':>4} {'prompt':>7} {'new':>5} {'live':>9} {'disk':>9} {'live/disk':>9}  "
          "restored tokens (live, disk)")  # fmt: skip
    for n, prompt, new, live_s, disk_s, restored in rows:
        print(f"{n:>4} {prompt:>7} {new:>5} {live_s * 1e3:>7.0f}ms {disk_s * 1e3:>7.0f}ms "
              f"{live_s / disk_s:>9.3f}  {restored}")  # fmt: skip
    saved = statistics.median(d - lv for _, _, _, lv, d, _ in rows) * 1e3
    print(f"median time a turn saves by continuing the live state: {saved:.0f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
