"""The llama.cpp memory requirement (``werk_llamacpp.requirement``) vs the child's observed peak.

For the tiny demo model and, with ``--gguf``, the medium one: ``werk serve --model demo`` spawns
its llama-server on a first chat; the benchmark then fills one slot with a long prompt (about
``--tokens`` tokens of the demo tokenizer, so the KV cache is written), reads the child's peak
resident set (``VmHWM`` in ``/proc/<pid>/status``) and prints it next to the estimate from the same
GGUF file and the child's own argument list. The estimate must not be below the peak by more
than its compute margin (issue 16); an estimate above the peak is memory reserved but unused
(llama.cpp allocates the whole KV cache, and pages never written stay unresident).

Run: ``.venv/bin/python benchmarks/llamacpp_memory_requirement.py [--gguf MEDIUM.gguf]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import httpx
from llamacpp_prefix_value import long_prompt
from llamacpp_proxy_overhead import create_demo, import_model, managed_child, werk_serve
from werk_llamacpp.requirement import requirement_for

MIB = 1024 * 1024


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def measure(home: Path, label: str, tokens: int) -> None:
    log = home.parent / f"serve-{label}.log"
    with (
        werk_serve(home, ["demo"], log) as served,
        httpx.Client(base_url=served.url, timeout=600) as client,
    ):
        chat = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
        client.post("/v1/chat/completions", json={**chat, "max_tokens": 2}).raise_for_status()
        child = managed_child(served.process.pid)
        long = {"model": "demo", "prompt": long_prompt(tokens, seed=1), "max_tokens": 2}
        client.post("/v1/completions", json=long).raise_for_status()
        model = Path(child.args[child.args.index("-m") + 1])
        estimate = requirement_for(model, child.args[1:])
        peak = peak_rss(child.pid)
    print(f"{label}: {model.stat().st_size / MIB:.1f} MiB GGUF")
    print(
        f"  estimate {estimate.total_bytes / MIB:8.1f} MiB = weights "
        f"{estimate.weights_bytes / MIB:.1f} + KV {estimate.kv_cache_bytes / MIB:.1f} "
        f"+ compute margin {estimate.compute_bytes / MIB:.1f}"
    )
    verdict = "ok" if estimate.total_bytes >= peak - estimate.compute_bytes else "TOO LOW"
    print(f"  observed peak RSS (VmHWM) {peak / MIB:8.1f} MiB  ({verdict})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", type=Path, help="a medium demo GGUF (create-demo --size medium)")
    parser.add_argument("--tokens", type=int, default=2000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        tiny = Path(tmp) / "tiny" / "home"
        tiny.mkdir(parents=True)
        create_demo(tiny)
        measure(tiny, "tiny demo", args.tokens)
        if args.gguf is not None:
            medium = Path(tmp) / "medium" / "home"
            medium.mkdir(parents=True)
            import_model(medium, args.gguf.resolve(), "demo")
            measure(medium, "medium demo", args.tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
