"""A growing conversation continued from its last saved state after a restart, per turn, against
a cold prefill of the same messages: ``werk serve`` with the llama.cpp medium demo model.

Each turn keeps what a persisted ``/v1`` chat turn keeps (``"werk": {"persist": true}``): the
conversation *with its reply* as a disk state. Turn 1 is prefilled with ``retention: disk`` and
decoded; then the messages with the reply are prefilled with ``retention: disk`` (it continues
turn 1's state and keeps the reply on top of it — a persisted chat does this on the live slot
the reply was decoded in, the benchmark through the control API). For every later turn,
``werk serve`` is restarted (a new llama-server process generation), the conversation so far
plus the next user message is prefilled with ``reuse: prefer`` and ``retention: ephemeral`` —
it continues the last turn's state (``match: prefix``) and evaluates only the new message; like
a persisted turn's prefill, it writes nothing to disk, the turn's state being written after the
reply — and the same messages are prefilled cold (``reuse: disabled``, ``retention:
ephemeral``, a fresh slot). With ``--prompt-states`` the continued prefill keeps its prompt on
disk (``retention: disk``, its time includes that write) and no reply is kept, as persisted
chats did before they kept the reply. Time to the first token is the prefill's
wall time (the Decode then computes one token either way); the table shows each turn's prompt,
the tokens evaluated after the restored state and their share of the prompt, both times and
their ratio, the ratio divided by that share ("/new %": 1.00 would mean the continued prefill
cost exactly the new tokens' share of the cold one, nothing for the restore, and no more per
token than the cold prefill's average), and whether the two greedy continuations were equal.

Run: ``.venv/bin/python benchmarks/chat_continuation.py [--turns 10] [--size medium]
[--reply-tokens 128]`` (needs the llama-server build: ``make llama-server``). Figures are
printed, never asserted.
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


def prefill(
    client: httpx.Client, messages: list[dict[str, str]], reuse: str, retention: str = "disk"
) -> tuple[float, Any]:
    body = {
        "model": "demo",
        "messages": messages,
        "allow_experimental": True,
        "policy": {"retention": retention, "reuse": reuse},
    }
    started = time.perf_counter()
    answer = client.post("/werk/v1/prefill", json=body, timeout=600)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    return seconds, answer.json()


def decode(client: httpx.Client, token: str, max_tokens: int) -> str:
    body = {"handoff": token, "max_tokens": max_tokens, "temperature": 0}
    answer = client.post("/werk/v1/decode", json=body, timeout=600)
    answer.raise_for_status()
    return str(answer.json()["text"])


def keep_reply(client: httpx.Client, messages: list[dict[str, str]], reply: str) -> None:
    """Keep the conversation with its reply as a disk state (what a persisted turn keeps)."""
    _, kept = prefill(client, [*messages, {"role": "assistant", "content": reply}], "prefer")
    if kept["reuse"].get("match") != "prefix":
        raise SystemExit(f"keeping the reply did not continue the turn's state: {kept['reuse']}")


def agreement(continued: str, cold: str) -> str:
    """``yes`` when the two greedy replies are equal, else how many characters they share."""
    if continued == cold:
        return "yes"
    shared = next((i for i, (a, b) in enumerate(zip(continued, cold, strict=False)) if a != b),
                  min(len(continued), len(cold)))  # fmt: skip
    return f"{shared} chars"


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
    parser.add_argument("--reply-tokens", type=int, default=128, help="each reply's max_tokens")
    parser.add_argument(
        "--prompt-states",
        action="store_true",
        help="keep only each turn's prompt (not its reply), as persisted chats did before they "
        "kept the reply: the next turn then evaluates the reply too",
    )
    args = parser.parse_args(argv)
    rows: list[tuple[int, int, int, float, float, str]] = []
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
            reply = decode(c, first["handoff"]["token"], args.reply_tokens)
            if not args.prompt_states:
                keep_reply(c, messages, reply)
        kept = "its prompt" if args.prompt_states else "with its reply"
        # A persisted turn writes its state after the reply (the state with the reply) where
        # the backend has proven prefix continuation, so its prefill keeps nothing; keeping
        # only the prompt, the prefill itself writes it, before the reply.
        keep_prompt = "disk" if args.prompt_states else "ephemeral"
        print(f"turn 1: {first['usage']['prompt_tokens']} prompt tokens, saved to disk {kept}")
        for turn in range(2, args.turns + 1):
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": QUESTION.format(n=turn)},
            ]
            with werk_serve(home, ["demo"], log) as served, httpx.Client(base_url=served.url) as c:
                wait_for_proof(c)
                warm_s, warm = prefill(c, messages, "prefer", keep_prompt)
                cold_s, cold = prefill(c, messages, "disabled", "ephemeral")
                reply = decode(c, warm["handoff"]["token"], args.reply_tokens)
                same = agreement(reply, decode(c, cold["handoff"]["token"], args.reply_tokens))
                if turn < args.turns and not args.prompt_states:
                    keep_reply(c, messages, reply)
            usage, reuse = warm["usage"], warm["reuse"]
            if reuse.get("match") != "prefix":
                raise SystemExit(f"turn {turn} did not continue the last state: {reuse}")
            rows.append(
                (turn, usage["prompt_tokens"], usage["evaluated_tokens"], warm_s, cold_s, same)
            )
    print(f"{'turn':>4} {'prompt':>7} {'new':>5} {'new %':>6} {'continued':>10} "
          f"{'cold':>9} {'ratio':>6} {'/new %':>6}  same text  "
          f"goal (<= {GOAL} where new <= 10 %)")  # fmt: skip
    for turn, prompt, new, warm_s, cold_s, same in rows:
        share, ratio = new / prompt, warm_s / cold_s
        goal = ("met" if ratio <= GOAL else "NOT met") if share <= 0.10 else "-"
        print(f"{turn:>4} {prompt:>7} {new:>5} {share * 100:>5.1f}% {warm_s * 1e3:>8.0f}ms "
              f"{cold_s * 1e3:>7.0f}ms {ratio:>6.3f} {ratio / share:>6.2f}  {same:>9}  "
              f"{goal}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
