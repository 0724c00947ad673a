"""Proxy overhead of Werk's ``/v1`` in front of its managed llama-server vs the same child directly.

One ``werk serve --model demo`` (the tiny generated demo model) spawns its llama-server on the
first request; the benchmark finds that child through ``/proc`` (its command line gives port and
API key) and sends the *same* short chat body both ways:

* **sequential**: ``--rounds`` (200) non-streamed ``/v1/chat/completions`` per side, interleaved
  (Werk, direct, Werk, …) on one keep-alive connection each, after ``--warmup`` rounds; median,
  p90 and mean latency, and Werk's added median;
* **streamed**: the same chat with ``"stream": true``, interleaved the same way; the time to
  the first SSE event that carries content (median, p90) and Werk's added median;
* **concurrent**: ``--clients`` (8) threads, each with its own keep-alive client, sending
  ``--per-client`` requests; ``--concurrent-rounds`` (9) rounds per side, interleaved; the median
  requests per second of each side and their ratio Werk/direct. Control relays in front
  of the same child run in the same rotation (``benchmarks/controls.py``; ``--no-control``
  leaves them out): a byte-for-byte one, the least a Python HTTP relay on Werk's stack does
  (what any such relay pays here), and that least relay pinning each request to a general slot
  as Werk does (against the minimal one: what pinning costs); and the direct child once more as a
  side of its own (``again``): its ratio to direct, where nothing differs, is one sample of
  how far this run's throughput ratios stray from their true values by chance.

Direct requests carry no ``id_slot`` (llama-server picks among all its slots); Werk pins each
request to one of the general slots (the state slot is never used for ``/v1``).

Then the goal table: added p50 ≤ 0.6 ms and Werk/direct req/s ≥ 0.95, each met or not
(``--json PATH`` writes it as JSON too; ``benchmarks/repeat_goals.py`` runs the benchmark
several times and prints the table on the medians).

Run: ``.venv/bin/python benchmarks/llamacpp_proxy_overhead.py [--rounds 200] [--clients 8]``.
Figures are printed, never asserted. Helpers here are shared by the other llama.cpp benchmarks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from controls import control_relays

from werk.supervise import stop_group

BIN = Path(sys.executable).parent
WERK = BIN / "werk"
CHAT = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Say hi."}],
    "max_tokens": 8,
    "temperature": 0,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def werk_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WERK_HOME"}
    env["WERK_HOME"] = str(home)
    return env


def create_demo(home: Path, model_id: str = "demo", size: str = "tiny") -> None:
    subprocess.run(
        [str(WERK), "models", "create-demo", "--id", model_id, "--size", size],
        check=True,
        capture_output=True,
        env=werk_env(home),
    )


def import_model(home: Path, path: Path, model_id: str) -> None:
    subprocess.run(
        [str(WERK), "models", "import", str(path), "--id", model_id, "--backend", "llamacpp"],
        check=True,
        capture_output=True,
        env=werk_env(home),
    )


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    started: float


def wait_http(
    url: str,
    process: subprocess.Popen[bytes],
    timeout: float = 600,
    client: httpx.Client | None = None,
) -> None:
    """Poll ``url`` every 5 ms until it answers 200, with ``client`` if given.

    One client for all polls: ``httpx.get`` builds a client with a TLS context per call, about
    20 ms of CPU, which on a 2-core machine took most of a core from the process being timed.
    """
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(httpx.Client(timeout=1))
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{url}: the process exited {process.returncode}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(url).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not become ready")
            time.sleep(0.005)


@contextlib.contextmanager
def werk_serve(
    home: Path,
    models: Sequence[str],
    log: Path,
    client: httpx.Client | None = None,
    *,
    program: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> Iterator[Served]:
    """Run ``werk serve`` until the block ends; ``client`` (if given) polls its health.
    ``program``: what runs instead of the ``werk`` script (e.g. ``python -c BOOTSTRAP``), given
    the same arguments (``serve --port … --model …``); ``args``: more ``werk serve`` arguments."""
    port = free_port()
    env = {**werk_env(home), **(extra_env or {})}
    argv = [*(program or [str(WERK)]), "serve", "--port", str(port)]
    started = time.perf_counter()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*argv, *[a for m in models for a in ("--model", m)], *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/werk/v1/health", process, client=client)
        yield Served(process, url, started)
    finally:
        stop_group(process, grace=60)  # Werk's own stop path: SIGTERM, bounded wait, SIGKILL


@dataclass
class ChildInfo:
    pid: int
    url: str
    key: str
    args: list[str]


def managed_child(werk_pid: int) -> ChildInfo:
    """The llama-server that ``werk serve`` spawned, from ``/proc``."""
    for task in os.listdir(f"/proc/{werk_pid}/task"):
        with open(f"/proc/{werk_pid}/task/{task}/children") as f:
            for pid in map(int, f.read().split()):
                with open(f"/proc/{pid}/cmdline", "rb") as c:
                    args = [a.decode() for a in c.read().split(b"\0") if a]
                if args and args[0].endswith("llama-server"):
                    port = args[args.index("--port") + 1]
                    key = args[args.index("--api-key") + 1]
                    return ChildInfo(pid, f"http://127.0.0.1:{port}", key, args)
    raise RuntimeError("no llama-server child found")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (all its threads) so far, from ``/proc``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def print_modes(through: Sequence[float], straight: Sequence[float]) -> None:
    """When the pooled latencies form two clear modes (a backend whose scheduler answers either
    fast or one cycle later), print each side's share in the slow mode and the added p50 within
    each mode: the overall p50 then lands in whichever mode holds half of a side's requests, and
    the difference of two such medians says little about the relay."""
    pooled = sorted([*through, *straight])
    low, high = pooled[0], pooled[-1]
    for _ in range(50):  # two-means in one dimension
        split = (low + high) / 2
        fast = [v for v in pooled if v <= split]
        slow = [v for v in pooled if v > split]
        if not fast or not slow:
            return
        low, high = statistics.fmean(fast), statistics.fmean(slow)
    spread = max(statistics.pstdev(fast), statistics.pstdev(slow))
    if min(len(fast), len(slow)) < len(pooled) // 10 or high - low < 4 * spread:
        return  # one mode (or no clear second one): the p50 figures stand as they are
    split = (low + high) / 2
    print(f"  two modes (about {low * 1e3:.1f} and {high * 1e3:.1f} ms):")
    for name, values in (("werk  ", through), ("direct", straight)):
        share = sum(v > split for v in values) / len(values)
        print(f"    {name} {share:6.1%} of requests in the slow mode")
    for mode, keep in (("fast", lambda v: v <= split), ("slow", lambda v: v > split)):
        a, b = [v for v in through if keep(v)], [v for v in straight if keep(v)]
        if a and b:
            added = (statistics.median(a) - statistics.median(b)) * 1e3
            print(f"    added p50 within the {mode} mode {added:+.3f} ms ({len(a)} / {len(b)})")


# llama-server sometimes closes a kept-alive connection right after a streamed reply (and after
# a number of requests); a request already sent on it ends with "Server disconnected without
# sending a response". Werk's relay sends such a request once more on a new connection; the
# benchmark's own clients (either side) do the same and time the second attempt, so that the
# direct side's connection handling does not end a run half-way. Each such retry is printed.


def _closed_unanswered(client: httpx.Client) -> None:
    print(f"  (sent once more: {client.base_url} closed the connection without answering)")


def _post(client: httpx.Client, body: dict[str, Any]) -> float:
    for attempt in (1, 2):
        start = time.perf_counter()
        try:
            answer = client.post("/v1/chat/completions", json=body)
        except httpx.RemoteProtocolError:
            if attempt == 2:
                raise
            _closed_unanswered(client)
            continue
        elapsed = time.perf_counter() - start
        answer.raise_for_status()
        return elapsed
    raise AssertionError("unreachable")


LAST_CPU = [0.0]
"""werk serve's CPU per request (ms) in the last :func:`interleaved` run."""


def interleaved(
    werk: httpx.Client,
    direct: httpx.Client,
    measure: Callable[[httpx.Client], float],
    rounds: int,
    warmup: int,
    werk_pid: int,
) -> tuple[list[float], list[float]]:
    """``measure`` each side in turn (Werk, direct, Werk, …) after ``warmup`` untimed pairs.

    Also prints the CPU time the ``werk serve`` process spent per request through it (all its
    threads; Werk is idle while the direct requests run): less noisy than latency on a busy
    machine, and what the hop costs the cores the child shares with it.
    """
    for _ in range(warmup):
        measure(werk)
        measure(direct)
    through, straight = [], []
    cpu_before = cpu_seconds(werk_pid)
    for _ in range(rounds):
        through.append(measure(werk))
        straight.append(measure(direct))
    cpu = (cpu_seconds(werk_pid) - cpu_before) / rounds
    for name, values in (("werk  ", through), ("direct", straight)):
        print(
            f"  {name} p50 {statistics.median(values) * 1e3:7.3f} ms"
            f"  p90 {percentile(values, 0.9) * 1e3:7.3f} ms"
            f"  mean {statistics.fmean(values) * 1e3:7.3f} ms"
        )
    print(f"  werk serve CPU per request {cpu * 1e3:.3f} ms")
    paired = statistics.median(a - b for a, b in zip(through, straight, strict=True)) * 1e3
    print(f"  median of the paired differences (each Werk request minus the direct one after "
          f"it) {paired:+.3f} ms")  # fmt: skip
    LAST_CPU[0] = cpu * 1e3
    return through, straight


def _bodies(
    werk: httpx.Client, werk_body: dict[str, Any], direct_body: dict[str, Any]
) -> Callable[[httpx.Client], dict[str, Any]]:
    """Which body each side gets (the direct server may know the model by another name)."""
    return lambda client: werk_body if client is werk else direct_body


def sequential(
    werk: httpx.Client,
    direct: httpx.Client,
    rounds: int,
    warmup: int,
    werk_pid: int,
    *,
    werk_body: dict[str, Any] = CHAT,
    direct_body: dict[str, Any] = CHAT,
) -> tuple[float, float]:
    """Print the sequential figures; return (added p50 in ms, werk serve CPU per request)."""
    print(f"sequential: {rounds} short non-streamed chats per side (interleaved, keep-alive)")
    body = _bodies(werk, werk_body, direct_body)
    through, straight = interleaved(
        werk, direct, lambda c: _post(c, body(c)), rounds, warmup, werk_pid
    )
    added = (statistics.median(through) - statistics.median(straight)) * 1e3
    ratio = statistics.median(through) / statistics.median(straight)
    print(f"  added p50 {added:+.3f} ms   p50 ratio werk/direct {ratio:.3f}")
    print_modes(through, straight)
    return added, LAST_CPU[0]


def _has_content(data: str) -> bool:
    try:
        event = json.loads(data)
    except ValueError:
        return False
    choices = event.get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


def _first_byte(client: httpx.Client, body: dict[str, Any]) -> float:
    """Seconds from sending a streamed chat to the first SSE event that carries content."""
    for attempt in (1, 2):
        start = time.perf_counter()
        first = None
        answered = False
        try:
            with client.stream("POST", "/v1/chat/completions", json=body) as answer:
                answered = True
                answer.raise_for_status()
                for line in answer.iter_lines():
                    if first is None and line.startswith("data:") and _has_content(line[5:]):
                        first = time.perf_counter() - start
        except httpx.RemoteProtocolError:
            if answered or attempt == 2:
                raise
            _closed_unanswered(client)
            continue
        if first is None:
            raise RuntimeError("the stream carried no content")
        return first
    raise AssertionError("unreachable")


def streamed(
    werk: httpx.Client,
    direct: httpx.Client,
    rounds: int,
    warmup: int,
    werk_pid: int,
    *,
    werk_body: dict[str, Any] = CHAT,
    direct_body: dict[str, Any] = CHAT,
) -> float:
    """Print the streamed figures; return the added p50 to the first content byte in ms."""
    body = _bodies(werk, {**werk_body, "stream": True}, {**direct_body, "stream": True})
    print(f"streamed: {rounds} short streamed chats per side, time to the first content byte")
    through, straight = interleaved(
        werk, direct, lambda c: _first_byte(c, body(c)), rounds, warmup, werk_pid
    )
    added = (statistics.median(through) - statistics.median(straight)) * 1e3
    print(f"  added p50 to the first content byte {added:+.3f} ms")
    print_modes(through, straight)
    return added


def concurrent(
    url: str,
    headers: dict[str, str],
    clients: int,
    per_client: int,
    body: dict[str, Any] = CHAT,
) -> float:
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)

    def run() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=120) as client:
            _post(client, body)
            barrier.wait()
            try:
                for _ in range(per_client):
                    _post(client, body)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return clients * per_client / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-client", type=int, default=50)
    parser.add_argument(
        "--concurrent-rounds",
        type=int,
        default=9,
        help="concurrent rounds per side, alternating which side goes first (one round's "
        "req/s varies by a quarter on a busy 2-core machine; the medians are compared)",
    )
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="leave the control relays (benchmarks/controls.py) and the direct child's second "
        "side (again) out of the concurrent rounds",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the goal table to PATH as JSON")
    parser.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more `werk serve` argument (repeatable), e.g. --serve-arg=--quiet to "
        "measure without the access log",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home)
        log = Path(tmp) / "serve.log"
        with werk_serve(home, ["demo"], log, args=args.serve_arg) as served:
            with httpx.Client(base_url=served.url, timeout=120) as werk:
                _post(werk, CHAT)  # spawns the child
                child = managed_child(served.process.pid)
                headers = {"Authorization": f"Bearer {child.key}"}
                with httpx.Client(base_url=child.url, headers=headers, timeout=120) as direct:
                    shown = ["<api-key>" if a == child.key else a for a in child.args[1:]]
                    print(f"llama-server pid {child.pid}: {' '.join(shown)}")
                    pid = served.process.pid
                    added, _ = sequential(werk, direct, args.rounds, args.warmup, pid)
                    streamed(werk, direct, args.rounds, args.warmup, pid)
            port = int(child.url.rsplit(":", 1)[1])
            general = general_slots(child.args)
            with control_relays(
                port, child.key, enabled=not args.no_control, pin_slots=general
            ) as relays:
                throughput = concurrent_rounds(
                    (served.url, {}, CHAT),
                    (child.url, headers, CHAT),
                    rounds=args.concurrent_rounds,
                    clients=args.clients,
                    per_client=args.per_client,
                    controls=[
                        (name, (url, headers if name == "bytes" else {}, CHAT))
                        for name, url in relays.items()
                    ],
                    same_server=not args.no_control,
                )
    print_goals(GOALS, (added, throughput.ratio), throughput, args.json)
    return 0


def general_slots(args: Sequence[str]) -> tuple[int, ...]:
    """The child's slots for ``/v1`` traffic: all of its ``-np`` slots but the last
    ``DEFAULT_STATE_SLOTS`` (reserved for named states; the benchmark's model sets no
    ``state_slots`` option)."""
    from werk_llamacpp.args import DEFAULT_STATE_SLOTS

    slots = int(args[args.index("-np") + 1])
    return tuple(range(slots - DEFAULT_STATE_SLOTS))


Goal = tuple[str, str, float, str]
"""(what, unit, goal, ``"<="`` or ``">="``) of one line of a benchmark's goal table."""

GOALS: tuple[Goal, ...] = (
    ("llama.cpp relay: added p50, short non-streamed chat", "ms", 0.6, "<="),
    ("llama.cpp relay: 8 clients req/s / direct", "", 0.95, ">="),
)


def goal_met(goal: Goal, value: float) -> bool:
    """Whether ``value`` meets ``goal``."""
    _, _, bound, way = goal
    return value <= bound if way == "<=" else value >= bound


def goal_line(goal: Goal, value: float, what: str = "") -> str:
    """``goal``'s line of a goal table for ``value``: the value, the goal, met or not."""
    name, unit, bound, way = goal
    shown = f"{value:+.3f} {unit}" if unit else f"{value:.3f}"
    limit = f"{bound} {unit}" if unit else f"{bound}"
    verdict = "met" if goal_met(goal, value) else "NOT met"
    return f"{name}: {what}{shown} (goal {way} {limit}) {verdict}"


def print_goals(
    goals: Sequence[Goal],
    values: Sequence[float],
    throughput: Throughput | None = None,
    json_path: str | None = None,
) -> None:
    """Print each goal with this run's value and whether the run met it; then, with
    ``throughput``, how far the same server measured twice read from 1 in this run. With
    ``json_path``, the same goes to that file as JSON (``benchmarks/repeat_goals.py`` reads
    it): ``{"goals": [{"name", "unit", "goal", "way", "value", "met"}, …],
    "same_server": float | null}``."""
    print("goals (this run):")
    for goal, value in zip(goals, values, strict=True):
        print(f"  {goal_line(goal, value)}")
    if json_path is not None:
        fields = ("name", "unit", "goal", "way")
        rows = [
            {**dict(zip(fields, goal, strict=True)), "value": v, "met": goal_met(goal, v)}
            for goal, v in zip(goals, values, strict=True)
        ]
        same = throughput.same_server if throughput is not None else None
        Path(json_path).write_text(json.dumps({"goals": rows, "same_server": same}, indent=1))
    if throughput is not None and throughput.same_server is not None:
        print(
            f"  (direct measured twice read {throughput.same_server:.3f} where nothing differs: "
            "one sample of how far this run's throughput ratio can stray from 1 by chance)"
        )


Side = tuple[str, dict[str, str], dict[str, Any]]
"""(base URL, headers, chat body) of one side of a throughput comparison."""


@dataclass(frozen=True)
class Throughput:
    """What :func:`concurrent_rounds` found: Werk's req/s over direct's (medians), and the
    direct server's over itself measured as a second side in the same rotation (``None``
    when not measured): how far from 1 a ratio reads in this run when nothing differs."""

    ratio: float
    same_server: float | None


def concurrent_rounds(
    werk: Side,
    direct: Side,
    *,
    rounds: int,
    clients: int,
    per_client: int,
    controls: Sequence[tuple[str, Side]] = (),
    same_server: bool = True,
) -> Throughput:
    """Interleaved concurrent rounds (the order rotating from round to round); prints each
    side's median req/s and the ratio Werk/direct. ``controls``: more sides (name and
    target; ``benchmarks/controls.py``) measured in the same rotation, each one's ratio to
    direct printed too. ``same_server``: the direct side is measured a second time, as a side
    named ``again``, in the same rotation (an A/A comparison: its ratio to direct is the
    comparison's own spread in this run, with no hop and no other code in between)."""
    sides: list[tuple[str, Side]] = [("werk", werk), ("direct", direct), *controls]
    if same_server:
        sides.append(("again", direct))
    print(
        f"concurrent: {clients} clients x {per_client} short chats, "
        f"{rounds} rounds per side, {len(sides)} sides (interleaved)"
    )
    rates: dict[str, list[float]] = {name: [] for name, _ in sides}
    for round_ in range(rounds):
        shift = round_ % len(sides)
        for name, (url, auth, body) in sides[shift:] + sides[:shift]:
            rates[name].append(concurrent(url, auth, clients, per_client, body))
    for name, values in rates.items():
        shown = " ".join(f"{r:.0f}" for r in values)
        print(f"  {name:7} {statistics.median(values):8.1f} req/s median ({shown})")
    straight = statistics.median(rates["direct"])
    for name, _ in controls:
        print(f"  control {name} / direct {statistics.median(rates[name]) / straight:.3f}")
    again = statistics.median(rates["again"]) / straight if same_server else None
    if again is not None:
        print(f"  same server again / direct {again:.3f} (nothing differs)")
    ratio = statistics.median(rates["werk"]) / straight
    print(f"  throughput ratio werk/direct {ratio:.3f}")
    return Throughput(ratio, again)


if __name__ == "__main__":
    raise SystemExit(main())
