"""Control relays for the relay benchmarks' concurrent rounds.

Relays in front of the same server as Werk, measured in the same rotation:

* ``bytes`` (``benchmarks/byte_relay.py``): copies bytes, parses nothing: what a hop that does
  no work changes. (A hop also reshapes how requests arrive at the server: on the 2-core machine
  it read above direct in most runs, docs/performance.md. The comparison's own spread is the
  benchmarks' ``again`` side, the direct server measured twice.)
* ``minimal`` (``benchmarks/minimal_relay.py``): uvicorn + httptools + a bare ASGI app + the
  pooled ``werk.LoopbackClient``, nothing else. Its ratio to direct is what a relay on Werk's
  HTTP stack pays on this machine before doing any of Werk's work.
* ``pinned`` (llama.cpp only, ``pin_slots``): the minimal relay that also pins each request to
  one of the child's general slots, as Werk does to keep its state slot free (direct requests
  may use every slot). Its ratio to ``minimal`` is what pinning costs a relay that does nothing
  else (its ratio to direct also holds the hop; ``benchmarks/relay_cost.py --unreserved``
  measures what the state slot gives direct requests); Werk's ratio to it is what Werk's own
  work costs.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from werk.supervise import free_port

HERE = Path(__file__).parent


@dataclass(frozen=True)
class RelayProcess:
    """A control relay while it runs: its base URL and process id (for its CPU time)."""

    url: str
    pid: int


@contextlib.contextmanager
def relay_process(script: str, upstream: int, *extra: str) -> Iterator[RelayProcess]:
    """``benchmarks/SCRIPT LISTEN_PORT UPSTREAM *EXTRA`` on a free port until the block ends
    (killed and reaped after); the block starts once the port accepts connections."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(HERE / script), str(port), str(upstream), *extra]
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise SystemExit(f"the control relay {script} did not start") from None
                time.sleep(0.05)
        yield RelayProcess(f"http://127.0.0.1:{port}", process.pid)
    finally:
        process.kill()
        process.wait()


@contextlib.contextmanager
def control_relays(
    upstream: int,
    key: str | None = None,
    *,
    enabled: bool = True,
    pin_slots: Sequence[int] = (),
) -> Iterator[dict[str, str]]:
    """The control relays in front of ``upstream`` while the block runs: name → base URL
    (``{}`` when not ``enabled``; ``pinned`` only with ``pin_slots``). The byte relay forwards
    the client's own headers; the minimal relays send ``key`` upstream themselves (their
    clients send none)."""
    if not enabled:
        yield {}
        return
    keyed = [key] if key else []
    with contextlib.ExitStack() as stack:
        relays = {
            "bytes": stack.enter_context(relay_process("byte_relay.py", upstream)).url,
            "minimal": stack.enter_context(relay_process("minimal_relay.py", upstream, *keyed)).url,
        }
        if pin_slots:
            pins = ",".join(map(str, pin_slots))
            relays["pinned"] = stack.enter_context(
                relay_process("minimal_relay.py", upstream, *keyed, "--pin-slots", pins)
            ).url
        yield relays
