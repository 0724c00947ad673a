"""Restart to first token, with and without a restored state: what cross-restart reuse saves.

Through real ``werk serve`` processes with the *medium* generated demo model and one
~2,000-token prompt (issue 17):

1. first server: a short opted-in Prefill runs the functional probe (which leaves the canary);
   the long prompt is prefilled **cold** (``retention: disk``, evaluation + slot save + commit)
   and decoded for one token: the cold figure is that prefill's evaluation (a separate
   ``reuse: disabled``/``ephemeral`` prefill, timed alone) plus the one-token decode;
2. SIGTERM; **restored**: a new ``werk serve`` is spawned (it preloads the model: the new child
   starts as the server does, and because the first server left a canary, the new generation's
   state probe with its cross-restart step runs as soon as the child is ready) and, as soon as
   it answers, a Prefill with ``reuse: required`` (it waits for that probe, then Werk restores
   the state) and a one-token Decode. Printed from spawn and from the first request;
3. the same, but the request is sent only once ``runtime.state.restore.cross_restart`` reads
   ``experimental`` (what the restore itself costs, without waiting for the proof);
4. SIGTERM; **without a state**: a new ``werk serve``, then a ``reuse: disabled`` Prefill of the
   same prompt and a one-token Decode, from spawn and from the first request.

The ratio printed is restored (from the first request) ÷ cold prefill + decode; issue 17's goal
is <= 0.05. From the spawn it cannot be met on this model: Werk's own start (~0.3 s) plus
llama-server's load (~0.2 s) alone are ~0.06 of the cold prefill. The backend's own
``cached_tokens`` is printed as the evidence.

Run: ``.venv/bin/python benchmarks/llamacpp_cross_restart.py [--gguf PATH] [--tokens 2000]``.
``--gguf`` reuses a medium demo GGUF made earlier; otherwise one is generated.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from llamacpp_prefix_value import MODEL, first_token, long_prompt, prefill
from llamacpp_proxy_overhead import create_demo, import_model, werk_serve

CROSS = "runtime.state.restore.cross_restart"


def proven(client: httpx.Client) -> bool:
    rows = client.get("/werk/v1/capabilities", params={"model": MODEL}).json()["capabilities"]
    return any(row["id"] == CROSS and row["status"] == "experimental" for row in rows)


def restart_to_first_token(
    home: Path, log: Path, prompt: str, reuse: str, *, after_proof: bool = False
) -> tuple[float, float, dict[str, Any]]:
    """Spawn ``werk serve``, prefill ``prompt`` with ``reuse`` and decode one token: seconds
    from the spawn and from the first request, and the prefill's answer. ``after_proof``: the
    first request waits until the new generation reports cross-restart restore proven."""
    spawned = time.perf_counter()
    retention = "disk" if reuse == "required" else "ephemeral"
    with (
        werk_serve(home, [MODEL], log) as served,
        httpx.Client(base_url=served.url, timeout=3600) as client,
    ):
        deadline = time.monotonic() + 60
        while after_proof and not proven(client):
            if time.monotonic() > deadline:
                raise RuntimeError("cross-restart restore was not proven within 60 s")
            time.sleep(0.01)
        asked = time.perf_counter()
        _, answer = prefill(client, prompt, retention, reuse)
        first_token(client, answer["handoff"])
        done = time.perf_counter()
    return done - spawned, done - asked, answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, help="an existing medium demo GGUF to import")
    parser.add_argument("--tokens", type=int, default=2000)
    args = parser.parse_args(argv)
    prompt = long_prompt(args.tokens, seed=1)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if args.gguf is not None:
            import_model(home, args.gguf.resolve(), MODEL)
        else:
            create_demo(home, MODEL, "medium")
        log = Path(tmp) / "serve.log"
        with (
            werk_serve(home, [MODEL], log) as served,
            httpx.Client(base_url=served.url, timeout=3600) as client,
        ):
            probe_s, _ = prefill(client, "warm-up", "ephemeral", "disabled")
            print(f"first server: probe (first Prefill) {probe_s:.2f} s")
            cold_s, cold = prefill(client, prompt, "ephemeral", "disabled")
            cold_decode = first_token(client, cold["handoff"])
            cold_ttft = cold_s + cold_decode
            print(
                f"cold: prefill {cold_s:.2f} s + decode(1) {cold_decode:.3f} s = {cold_ttft:.2f} s "
                f"({cold['usage']['prompt_tokens']} prompt tokens)"
            )
            persist_s, persisted = prefill(client, prompt, "disk", "prefer")
            print(f"persist to disk: {persist_s:.2f} s ({persisted['state']['id']})")
        spawn_s, asked_s, answer = restart_to_first_token(home, log, prompt, "required")
        usage = answer["usage"]
        print(
            f"restart with the restored state: first token {spawn_s:.2f} s after spawn, "
            f"{asked_s:.2f} s after the first request; reuse {answer['reuse']['outcome']}, "
            f"cached_tokens {usage['cached_tokens']} of {usage['prompt_tokens']}"
        )
        _, proven_asked, proven_answer = restart_to_first_token(
            home, log, prompt, "required", after_proof=True
        )
        print(
            f"restart with the restored state, request after the proof: first token "
            f"{proven_asked:.2f} s after the request; cached_tokens "
            f"{proven_answer['usage']['cached_tokens']}"
        )
        fresh_spawn, fresh_asked, _ = restart_to_first_token(home, log, prompt, "disabled")
        print(
            f"restart without a state: first token {fresh_spawn:.2f} s after spawn, "
            f"{fresh_asked:.2f} s after the first request"
        )
        print(
            f"ratio restored / cold prefill+decode: {asked_s / cold_ttft:.3f} "
            f"(from spawn: {spawn_s / cold_ttft:.3f}; goal <= 0.05)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
