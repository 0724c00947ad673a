"""Loopback ports of child processes (:mod:`werk.ports`): ``listens_on`` through both of its
Linux sources, against psutil."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import psutil
import pytest

import werk
import werk.ports

_LISTENER = textwrap.dedent(
    """
    import socket, sys, time
    family = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
    listening = socket.socket(family)
    listening.bind(("::1" if sys.argv[1] == "6" else "127.0.0.1", 0))
    listening.listen()
    bound = socket.socket()  # bound to a port of its own but not listening
    bound.bind(("127.0.0.1", 0))
    connected = socket.create_connection(("127.0.0.1", listening.getsockname()[1])) \\
        if sys.argv[1] == "4" else None
    print(listening.getsockname()[1], bound.getsockname()[1], flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("source", ["netlink", "proc"])
@pytest.mark.parametrize("family", ["4", "6"])
def test_listens_on_finds_the_listening_socket_and_nothing_else(
    family: str, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``listens_on`` agrees with psutil, through ``sock_diag`` and through its ``/proc/net``
    fallback (used when netlink fails): the listening port yes; a port the process bound
    without listening, a port it does not hold, another process: no; a pid that is gone: cannot
    tell."""
    if family == "6" and not os.path.exists("/proc/net/tcp6"):
        pytest.skip("no IPv6 on this machine")
    monkeypatch.setattr(werk.ports, "_netlink_usable", True)  # whatever an earlier test did
    if source == "proc":

        def no_netlink(port: int, family: socket.AddressFamily) -> set[int]:
            raise OSError("sock_diag filtered")

        monkeypatch.setattr(werk.ports, "_listening_inodes_netlink", no_netlink)
    else:
        try:
            werk.ports._listening_inodes_netlink(0, socket.AF_INET)
        except OSError as exc:
            pytest.skip(f"no sock_diag netlink here ({exc})")
    child = subprocess.Popen(
        [sys.executable, "-c", _LISTENER, family], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        listening, bound = map(int, child.stdout.readline().split())
        assert werk.listens_on(child.pid, listening) is True
        assert werk.listens_on(child.pid, bound) is False
        assert werk.listens_on(child.pid, werk.free_port()) is False
        assert werk.listens_on(os.getpid(), listening) is False  # another process's socket
        conns = psutil.Process(child.pid).net_connections(kind="tcp")
        by_psutil = {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN}
        assert by_psutil == {listening}
        if source == "netlink":  # it really answered: the same inodes as /proc/net
            for af in (socket.AF_INET, socket.AF_INET6):
                by_netlink = werk.ports._listening_inodes_netlink(listening, af)
                assert by_netlink == werk.ports._listening_inodes_proc(listening, af)
    finally:
        child.kill()
        child.communicate()
    assert werk.listens_on(child.pid, listening) is None


def test_a_failed_netlink_is_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``sock_diag`` failure (refused, or silent for its one-second timeout) sends this call
    and every later one to ``/proc/net``: the wait is paid once per process, not per child."""
    monkeypatch.setattr(werk.ports, "_netlink_usable", True)
    asked: list[int] = []

    def failing_netlink(port: int, family: socket.AddressFamily) -> set[int]:
        asked.append(port)
        raise OSError("sock_diag timed out")

    monkeypatch.setattr(werk.ports, "_listening_inodes_netlink", failing_netlink)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert werk.listens_on(os.getpid(), port) is True  # answered from /proc/net
        assert werk.listens_on(os.getpid(), port) is True
    assert asked == [port]
