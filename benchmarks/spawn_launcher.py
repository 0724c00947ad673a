"""What ``werk.supervise`` adds to starting a child: the parent-death launcher and the port check.

* **launcher**: ``SupervisedProcess.spawn`` of ``/bin/true`` until it exits, through the
  ``setpriv`` + ``sh`` launcher, through the Python shim (``setpriv_executable`` answering
  ``None``, as on a machine without ``setpriv``), and ``subprocess`` without any launcher;
* **llama-server ready**: the same three ways of starting the managed llama-server build with the
  tiny demo model, polling ``/health`` every millisecond until it answers 200;
* **port check** on a listening llama-server: ``werk.listens_on`` as it runs here (``sock_diag``
  netlink), the same as after a failed netlink (its ``/proc/net/tcp`` fallback), and psutil's
  ``net_connections``.

Medians are printed, never asserted. Run:
``.venv/bin/python benchmarks/spawn_launcher.py [--runs 30] [--ready-runs 8]``.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
from llamacpp_proxy_overhead import create_demo
from werk_llamacpp.executable import locate_llama_server

import werk.ports
import werk.supervise
from werk.ports import free_port, listens_on
from werk.supervise import SupervisedProcess, stop_group


@contextmanager
def launcher(kind: str) -> Iterator[None]:
    """``setpriv`` (this machine's default), ``python shim`` (as without setpriv)."""
    original = werk.supervise.setpriv_executable
    if kind == "python shim":
        werk.supervise.setpriv_executable = lambda: None  # type: ignore[assignment]
    try:
        yield
    finally:
        werk.supervise.setpriv_executable = original  # type: ignore[assignment]


def spawn(kind: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    if kind == "no launcher":
        return subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
    with launcher(kind):
        return SupervisedProcess.spawn(argv, log_path=log).popen


def healthy(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def median_ms(measure: Callable[[], float], runs: int) -> float:
    return statistics.median(measure() for _ in range(runs)) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--ready-runs", type=int, default=8)
    args = parser.parse_args(argv)
    kinds = ["no launcher", "python shim"]
    if werk.supervise.setpriv_executable() is not None:
        kinds.append("setpriv")
    else:
        print("(no setpriv with --pdeathsig here: only the Python shim is measured)")
    with tempfile.TemporaryDirectory(prefix="werk-bench-") as tmp:
        log = Path(tmp) / "child.log"

        def true_once(kind: str) -> float:
            start = time.perf_counter()
            spawn(kind, ["/bin/true"], log).wait()
            return time.perf_counter() - start

        print(f"launcher: spawn /bin/true and wait, median of {args.runs}")
        for kind in kinds:
            print(f"  {kind:12} {median_ms(lambda k=kind: true_once(k), args.runs):6.1f} ms")

        home = Path(tmp) / "home"
        home.mkdir()
        create_demo(home)
        model = next((home / "models" / "files").glob("*.gguf"))
        located = locate_llama_server()  # the executable `werk serve` would use
        if located.path is None:
            raise SystemExit(f"no llama-server: {located.reason}")
        binary = str(located.path)

        def server(port: int) -> list[str]:
            return [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                    "-np", "5", "--no-warmup", "-c", "4096"]  # fmt: skip

        def ready_once(kind: str) -> float:
            port = free_port()
            start = time.perf_counter()
            child = spawn(kind, server(port), log)
            try:
                while not healthy(port):
                    if child.poll() is not None:
                        raise RuntimeError(f"llama-server exited: {log.read_text()[-500:]}")
                    time.sleep(0.001)
                return time.perf_counter() - start
            finally:
                stop_group(child)

        print(f"llama-server ready (/health 200, polled every ms), median of {args.ready_runs}")
        for kind in kinds:
            print(f"  {kind:12} {median_ms(lambda k=kind: ready_once(k), args.ready_runs):6.1f} ms")

        port = free_port()
        child = spawn("no launcher", server(port), log)
        try:
            while not healthy(port):
                time.sleep(0.01)

            def ours() -> float:
                start = time.perf_counter()
                assert listens_on(child.pid, port) is True
                return time.perf_counter() - start

            def by_psutil() -> float:
                start = time.perf_counter()
                conns = psutil.Process(child.pid).net_connections(kind="inet")
                assert any(c.laddr and c.laddr.port == port for c in conns)
                return time.perf_counter() - start

            def from_proc() -> float:
                werk.ports._netlink_usable = False  # as after a failed sock_diag
                try:
                    return ours()
                finally:
                    werk.ports._netlink_usable = True

            print(f"port check on a listening llama-server, median of {args.runs}")
            print(f"  listens_on (sock_diag)    {median_ms(ours, args.runs):6.2f} ms")
            print(f"  listens_on (/proc/net)    {median_ms(from_proc, args.runs):6.2f} ms")
            print(f"  psutil net_connections    {median_ms(by_psutil, args.runs):6.2f} ms")
        finally:
            stop_group(child)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
