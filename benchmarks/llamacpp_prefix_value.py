"""Prefix value: time to first token of a ~2,000-token prompt, cold vs after restoring its state.

Through a real ``werk serve`` with the *medium* generated demo model (TinyLlama's body, ~1 B
parameters, F16, ~1.9 GB; cold prefill of 2,000 tokens takes 10–40 s on 2 cores):

1. warm-up: a ``/v1`` chat spawns the child; a short opted-in Prefill runs the functional probe;
2. **cold**: Prefill of the long prompt (``retention: ephemeral``, ``reuse: disabled``) in an
   erased state slot, then Decode of one token — TTFT = both requests' wall time;
3. persist: Prefill of the same prompt with ``retention: disk`` (evaluation + slot save + fsync +
   catalog commit), timed for information;
4. evict: a short unrelated Prefill takes the only state slot, so the prefix is gone from the
   child (the RAM prompt cache is off: ``--cache-ram 0``);
5. **restored**: Prefill with ``reuse: prefer`` — the host copies the catalog payload (hash
   verified), the plugin restores it into the slot and continues — then Decode of one token.
   The ``cached_tokens`` printed is the server's own count: the restore's acknowledged
   ``n_restored`` (the whole prompt; nothing is evaluated until the Decode, whose own
   ``timings.cache_n`` must then be ``prompt tokens - 1`` or it fails).

Steps 4–5 repeat ``--repeat`` times; medians are printed, with the ratio cold/restored.

Run: ``.venv/bin/python benchmarks/llamacpp_prefix_value.py [--gguf PATH] [--tokens 2000]``.
``--gguf`` reuses a medium demo GGUF made earlier (``werk models create-demo --size medium
--output PATH``); otherwise one is generated into the temporary home. Figures are printed only.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from llamacpp_proxy_overhead import create_demo, import_model, werk_serve

MODEL = "medium"
# Letters outside the demo vocabulary's merges (" t", "he", "in", " the"): one token per byte.
ALPHABET = "abcdfgjklmopqrsuvwxyz"


def long_prompt(tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < tokens:
        word = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 8)))
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:tokens]


def timed(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    answer = client.post(path, json=body)
    elapsed = time.perf_counter() - start
    if answer.status_code != 200:
        raise RuntimeError(f"{path}: HTTP {answer.status_code}: {answer.text}")
    data: dict[str, Any] = answer.json()
    return elapsed, data


def prefill(
    client: httpx.Client, prompt: str, retention: str, reuse: str
) -> tuple[float, dict[str, Any]]:
    return timed(
        client,
        "/werk/v1/prefill",
        {
            "model": MODEL,
            "prompt": prompt,
            "allow_experimental": True,
            "policy": {"retention": retention, "reuse": reuse},
        },
    )


def first_token(client: httpx.Client, handoff: dict[str, Any]) -> float:
    elapsed, _ = timed(client, "/werk/v1/decode", {"handoff": handoff["token"], "max_tokens": 1})
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, help="an existing medium demo GGUF to import")
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    prompt = long_prompt(args.tokens, seed=1)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        start = time.perf_counter()
        if args.gguf is not None:
            import_model(home, args.gguf.resolve(), MODEL)
        else:
            create_demo(home, MODEL, "medium")
        print(f"model ready in {time.perf_counter() - start:.1f} s")
        with (
            werk_serve(home, [MODEL], Path(tmp) / "serve.log") as served,
            httpx.Client(base_url=served.url, timeout=3600) as client,
        ):
            start = time.perf_counter()
            timed(
                client,
                "/v1/chat/completions",
                {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
            )
            print(f"child spawned and answered in {time.perf_counter() - start:.1f} s")
            probe_s, _ = prefill(client, "warm-up", "ephemeral", "disabled")
            print(f"first Prefill (runs the functional probe) {probe_s:.2f} s")

            cold_prefill, cold = prefill(client, prompt, "ephemeral", "disabled")
            cold_decode = first_token(client, cold["handoff"])
            usage = cold["usage"]
            print(
                f"cold: prefill {cold_prefill:.2f} s + decode(1) {cold_decode:.3f} s; "
                f"prompt_tokens {usage['prompt_tokens']}, cached_tokens {usage['cached_tokens']}"
            )
            persist_s, persisted = prefill(client, prompt, "disk", "disabled")
            state = persisted["state"]
            print(
                f"persist: prefill + save + commit {persist_s:.2f} s; "
                f"snapshot {state['logical_bytes'] / 1e6:.1f} MB (tier {state['tier']})"
            )
            restored_ttft: list[float] = []
            for round_ in range(args.repeat):
                prefill(client, f"evict {round_}", "ephemeral", "disabled")
                restore_s, again = prefill(client, prompt, "disk", "prefer")
                decode_s = first_token(client, again["handoff"])
                restored_ttft.append(restore_s + decode_s)
                print(
                    f"restored #{round_ + 1}: restore + continue {restore_s:.3f} s + "
                    f"decode(1) {decode_s:.3f} s; reuse {again['reuse']['outcome']}, "
                    f"cached_tokens {again['usage']['cached_tokens']} of "
                    f"{again['usage']['prompt_tokens']}"
                )
            cold_ttft = cold_prefill + cold_decode
            best = statistics.median(restored_ttft)
            print(f"TTFT cold {cold_ttft:.2f} s, after restore (median) {best:.3f} s")
            print(
                f"ratio cold/restored {cold_ttft / best:.1f}x; restored / cold "
                f"{best / cold_ttft:.4f} (issue 15 goal <= 0.008)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
