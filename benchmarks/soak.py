"""A bounded soak of ``werk serve --persistence --model demo``: mixed traffic from N clients.

One ``werk serve`` (real llama-server child, the tiny generated demo model, a fresh
``WERK_HOME``) gets ``--requests`` requests in all from ``--clients`` concurrent clients on
loopback, each client cycling through the mix:

* a short chat, non-streamed and streamed (``/v1/chat/completions``, 8 tokens);
* a prefill → decode pair with ``retention: disk`` (two requests; the client's own prompt, so a
  decode that continued another client's state would show), and one with ``ephemeral``;
* a state listing (``GET /werk/v1/states?limit=50``).

Printed: requests/s, every answer by status (and by error code outside 2xx), whether every 429
was retryable with ``Retry-After``, wrong decodes (a decode whose text differs from the
uninterrupted greedy generation of its prompt), and ``werk serve``'s RSS, open fds and threads
plus its children's RSS at start, after the warm-up (the first 10 %) and at the end.

Run: ``.venv/bin/python benchmarks/soak.py [--requests 10000] [--clients 8] [--state-slots 1]``.
Loopback only; figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_proxy_overhead import create_demo, werk_serve

MAX_TOKENS = 8
ANIMALS = ["fox", "heron", "badger", "otter", "lynx", "crow", "hare", "moth", "wren", "newt"]


def prompt_of(client: int) -> str:
    animal = ANIMALS[client % len(ANIMALS)]
    return f"Client {client} tells a short story about a {animal} who repairs clocks."


def _proc_status(pid: int) -> dict[str, int]:
    fields: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                fields[key] = int(value.split()[0])
    fields["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return fields


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(p) for p in f.read().split()]
    return found


def resources(pid: int) -> str:
    own = _proc_status(pid)
    kids = []
    for child in _children(pid):
        try:
            kids.append(_proc_status(child)["VmRSS"])
        except (FileNotFoundError, KeyError):
            continue
    return (
        f"werk serve RSS {own['VmRSS'] / 1024:.1f} MiB, fds {own['fds']}, threads "
        f"{own['Threads']}; children RSS {' + '.join(f'{k / 1024:.0f}' for k in kids) or '-'} MiB"
    )


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: collections.Counter[str] = collections.Counter()
        self.unhinted_429 = 0
        self.wrong_decodes = 0
        self.done = 0

    def record(self, kind: str, response: httpx.Response) -> None:
        with self.lock:
            self.done += 1
            if response.is_success:
                self.answers[f"{kind} {response.status_code}"] += 1
                return
            try:
                error = response.json()["error"]
                code = error.get("code")
            except (ValueError, KeyError, TypeError):
                error, code = {}, "?"
            self.answers[f"{kind} {response.status_code} {code}"] += 1
            if response.status_code == 429 and not (
                error.get("retryable", True) and response.headers.get("retry-after")
            ):
                self.unhinted_429 += 1


def expected_texts(url: str, clients: int) -> list[str]:
    with httpx.Client(base_url=url, timeout=120) as client:
        texts = []
        for index in range(clients):
            body = {"model": "demo", "prompt": prompt_of(index), "max_tokens": MAX_TOKENS,
                    "temperature": 0}  # fmt: skip
            texts.append(client.post("/v1/completions", json=body).json()["choices"][0]["text"])
        return texts


def client_loop(
    url: str, index: int, budget: collections.deque[int], tally: Tally, expected: str
) -> None:
    chat = {"model": "demo", "messages": [{"role": "user", "content": f"Hi from {index}."}],
            "max_tokens": MAX_TOKENS, "temperature": 0}  # fmt: skip
    prompt = prompt_of(index)
    step = index
    with httpx.Client(base_url=url, timeout=300) as client:
        while True:
            try:
                budget.pop()
            except IndexError:
                return
            step += 1
            kind = ("chat", "stream", "disk pair", "ephemeral pair", "listing")[step % 5]
            if kind == "chat":
                tally.record("chat", client.post("/v1/chat/completions", json=chat))
            elif kind == "stream":
                with client.stream(
                    "POST", "/v1/chat/completions", json={**chat, "stream": True}
                ) as answer:
                    for _ in answer.iter_bytes():
                        pass
                tally.record("stream", answer)
            elif kind == "listing":
                tally.record("listing", client.get("/werk/v1/states", params={"limit": 50}))
            else:
                retention = "disk" if kind == "disk pair" else "ephemeral"
                body = {"model": "demo", "prompt": prompt, "allow_experimental": True,
                        "policy": {"retention": retention, "reuse": "prefer"}}  # fmt: skip
                prefilled = client.post("/werk/v1/prefill", json=body)
                tally.record(f"{retention} prefill", prefilled)
                if not prefilled.is_success:
                    continue
                with tally.lock:
                    if budget:
                        budget.pop()  # the decode is a request of the budget too
                token = prefilled.json()["handoff"]["token"]
                decoded = client.post(
                    "/werk/v1/decode", json={"handoff": token, "max_tokens": MAX_TOKENS}
                )
                tally.record(f"{retention} decode", decoded)
                if decoded.is_success and decoded.json()["text"] != expected:
                    with tally.lock:
                        tally.wrong_decodes += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument(
        "--state-slots", type=int, default=None, help="the demo model's state_slots option"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-soak-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home)
        if args.state_slots is not None:
            manifest = home / "models" / "demo.json"
            data = json.loads(manifest.read_text())
            data["options"] = {**data.get("options", {}), "state_slots": args.state_slots}
            manifest.write_text(json.dumps(data))
        log = Path(tmp) / "serve.log"
        with werk_serve(home, ["demo"], log, args=["--persistence"]) as served:
            pid = served.process.pid
            expected = expected_texts(served.url, args.clients)
            print(f"werk serve pid {pid}; {args.requests} requests from {args.clients} clients")
            print(f"  at start:         {resources(pid)}")
            warmup = max(1, args.requests // 10)
            tally = Tally()
            budget: collections.deque[int] = collections.deque(range(args.requests))
            threads = [
                threading.Thread(
                    target=client_loop,
                    args=(served.url, i, budget, tally, expected[i]),
                    daemon=True,
                )
                for i in range(args.clients)
            ]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            while tally.done < warmup and any(t.is_alive() for t in threads):
                time.sleep(0.05)
            print(f"  after warm-up:    {resources(pid)} ({tally.done} requests)")
            for thread in threads:
                thread.join()
            elapsed = time.monotonic() - started
            print(f"  at the end:       {resources(pid)}")
        total = sum(tally.answers.values())
        print(f"{total} requests in {elapsed:.1f} s: {total / elapsed:.1f} requests/s")
        for key, count in sorted(tally.answers.items()):
            print(f"  {key:<32} {count}")
        bad = sum(
            n for k, n in tally.answers.items() if _status(k) // 100 != 2 and _status(k) != 429
        )
        print(f"answers outside 2xx/429: {bad}; 429 without retryable/Retry-After: "
              f"{tally.unhinted_429}; decodes that continued another prompt: "
              f"{tally.wrong_decodes}")  # fmt: skip
    return 0


def _acceptable(status: int) -> bool:
    return 200 <= status < 300 or status == 429


def _status(key: str) -> int:
    return int(next(part for part in key.split() if part.isdigit() and len(part) == 3))


if __name__ == "__main__":
    raise SystemExit(main())
