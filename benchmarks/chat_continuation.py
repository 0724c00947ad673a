"""A growing conversation continued from its last saved state after a restart, per turn, against
a cold prefill of the same messages: ``werk serve`` with the llama.cpp medium demo model.

Turn 1 is prefilled with ``retention: disk``; then, for every later turn, ``werk serve`` is
restarted (a new llama-server process generation), the conversation so far plus one assistant
reply and one user message is prefilled with ``reuse: prefer`` — it continues the previous
turn's state (``match: prefix``) — and the same messages are prefilled cold (``reuse:
disabled``, a fresh slot). Time to the first token is the prefill's wall time (the Decode then
computes one token either way); the table shows each turn's prompt, the share of it that was
new, both times and their ratio, and whether the two greedy continuations were equal.

Run: ``.venv/bin/python benchmarks/chat_continuation.py [--turns 10] [--size medium]`` (needs
the llama-server build: ``make llama-server``). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_proxy_overhead import create_demo, werk_serve

GOAL = 0.05
SYSTEM = "You keep the clocks of an old workshop and answer in short sentences. " * 12
QUESTION = "Tell me about clock number {n}: who made it, and when does it chime? "


def prefill(client: httpx.Client, messages: list[dict[str, str]], reuse: str) -> tuple[float, Any]:
    body = {
        "model": "demo",
        "messages": messages,
        "allow_experimental": True,
        "policy": {"retention": "disk" if reuse != "disabled" else "ephemeral", "reuse": reuse},
    }
    started = time.perf_counter()
    answer = client.post("/werk/v1/prefill", json=body, timeout=600)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return seconds, answer.json()


def decode(client: httpx.Client, token: str) -> str:
    answer = client.post(
        "/werk/v1/decode", json={"handoff": token, "max_tokens": 16, "temperature": 0}, timeout=600
    )
    answer.raise_for_status()
    return str(answer.json()["text"])


def wait_for_proof(client: httpx.Client) -> None:
    """The restarted server's early probe (a canary exists) proves its rows in the
    background; wait for it so that no turn's time includes the probe."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = client.get("/werk/v1/capabilities", params={"model": "demo"}).json()
        status = {r["id"]: r["status"] for r in rows["capabilities"]}
        if status.get("runtime.state.restore.prefix") == "experimental":
            return
        time.sleep(0.1)
    raise SystemExit("the restarted server did not prove prefix continuation in 120 s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--size", default="medium")
    args = parser.parse_args(argv)
    rows: list[tuple[int, int, int, float, float, bool]] = []
    with tempfile.TemporaryDirectory(prefix="werk-bench-chat-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home, "demo", args.size)
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION.format(n=1)},
        ]
        log = Path(tmp) / "serve.log"
        with werk_serve(home, ["demo"], log) as served, httpx.Client(base_url=served.url) as c:
            _, first = prefill(c, messages, "prefer")
            reply = decode(c, first["handoff"]["token"])
        print(f"turn 1: {first['usage']['prompt_tokens']} prompt tokens, saved to disk")
        for turn in range(2, args.turns + 1):
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": QUESTION.format(n=turn)},
            ]
            with werk_serve(home, ["demo"], log) as served, httpx.Client(base_url=served.url) as c:
                wait_for_proof(c)
                warm_s, warm = prefill(c, messages, "prefer")
                cold_s, cold = prefill(c, messages, "disabled")
                reply = decode(c, warm["handoff"]["token"])
                same = decode(c, cold["handoff"]["token"]) == reply
            usage, reuse = warm["usage"], warm["reuse"]
            if reuse.get("match") != "prefix":
                raise SystemExit(f"turn {turn} did not continue the last state: {reuse}")
            rows.append(
                (turn, usage["prompt_tokens"], usage["evaluated_tokens"], warm_s, cold_s, same)
            )
    print(f"{'turn':>4} {'prompt':>7} {'new':>5} {'new %':>6} {'continued':>10} "
          f"{'cold':>9} {'ratio':>6}  same  goal (<= {GOAL} where new <= 10 %)")  # fmt: skip
    for turn, prompt, new, warm_s, cold_s, same in rows:
        share, ratio = new / prompt, warm_s / cold_s
        goal = ("met" if ratio <= GOAL else "NOT met") if share <= 0.10 else "-"
        equal = "yes" if same else "NO"
        print(f"{turn:>4} {prompt:>7} {new:>5} {share * 100:>5.1f}% {warm_s * 1e3:>8.0f}ms "
              f"{cold_s * 1e3:>7.0f}ms {ratio:>6.3f}  {equal:>4}  {goal}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
