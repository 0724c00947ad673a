"""Loopback ports of child processes: a free one to give a child, and whether a child listens
on the one it was given.

:func:`free_port` picks a port for a child to bind a moment later (a lost race shows up as the
child's bind failure, which its backend retries); :func:`listens_on` checks, once the child
answers, that it is the child that holds the port and not some other process that took it in
between; :func:`port_in_use` is ``werk serve``'s clear error for its own port. The first two
are public (``werk.free_port``, ``werk.listens_on``) and also importable from
:mod:`werk.supervise`, whose child processes they serve.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = ["free_port", "listens_on", "port_in_use"]


def free_port() -> int:
    """A currently free loopback port. The child binds it a moment later; a lost race shows up
    as a bind failure, which the caller retries with a new port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound (in use: by whom, when this user may see it), or
    ``None`` when it can. The server binds it right after; this only gives the clear error."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"cannot bind {host}:{port}: {exc.strerror}"
            holder = _listener(port)
            by = f" by {holder}" if holder else ""
            return (
                f"port {port} on {host} is already in use{by}; choose another with "
                f"--port N (or `make serve PORT=N`)"
            )
    return None


def _listener(port: int) -> str | None:
    """The process listening on ``port`` (``name (pid N)``), if this user may see it."""
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid is None:
                    return None
                return f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
    except Exception:  # permissions, a process that just ended: say nothing rather than guess
        return None
    return None


def listens_on(pid: int, port: int) -> bool | None:
    """Whether ``pid`` has a TCP LISTEN socket on ``port`` (``None``: cannot tell).

    On Linux: the socket inodes among the process's descriptors (``/proc/PID/fd``), compared
    with the inodes of the machine's listening TCP sockets on ``port``, which the kernel's
    ``sock_diag`` netlink interface lists (what ``ss -tln`` asks; 0.05 ms), or where that is not
    available, ``/proc/net/tcp`` and, only if needed, ``tcp6`` (3.5 ms, nearly all of it the
    kernel writing the table). Once netlink failed, this process uses ``/proc/net`` only: a
    sandbox that accepts the socket but never answers costs its one-second wait once, not at
    every child's start. Elsewhere psutil's ``net_connections`` (7 ms here). A backend asks
    right after readiness, on the way to the first token (``benchmarks/spawn_launcher.py``
    prints all three).
    """
    if _PROC_NET:
        try:
            inodes = _socket_inodes(pid)
        except OSError:  # gone, or not ours to read
            return None
        if not inodes:
            return False
        if _netlink_usable:
            try:
                return _any_listening(inodes, port, _listening_inodes_netlink)
            except OSError:  # no sock_diag here (e.g. filtered in a sandbox): not asked again
                _stop_asking_netlink()
        try:
            return _any_listening(inodes, port, _listening_inodes_proc)
        except OSError:
            return None
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


_PROC_NET = sys.platform.startswith("linux") and os.path.exists("/proc/net/tcp")
_TCP_LISTEN = 10  # include/net/tcp_states.h: TCP_LISTEN ("0A" in /proc/net/tcp)
_netlink_usable = True  # until sock_diag failed once in this process


def _stop_asking_netlink() -> None:
    global _netlink_usable
    _netlink_usable = False


def _socket_inodes(pid: int) -> set[int]:
    fd_dir = f"/proc/{pid}/fd"
    inodes = set()
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


# linux/netlink.h, linux/sock_diag.h, linux/inet_diag.h
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLMSG_HEADER = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_INET_DIAG_REQ_V2 = struct.Struct("=BBBBI48x")  # family, protocol, ext, pad, states; sockid 0
_INET_DIAG_MSG = struct.Struct("=BBBB2s46xIIIII")  # family, state, timer, retrans, sport, ...
# ... sockid's dport, src, dst, if, cookie (46 bytes); expires, rqueue, wqueue, uid, inode


def _any_listening(
    inodes: set[int], port: int, listening: Callable[[int, socket.AddressFamily], set[int]]
) -> bool:
    """Whether one of ``inodes`` listens on ``port``: IPv4 first, IPv6 only if needed."""
    return any(not inodes.isdisjoint(listening(port, f)) for f in (socket.AF_INET, socket.AF_INET6))


def _listening_inodes_netlink(port: int, family: socket.AddressFamily) -> set[int]:
    """The inodes of the TCP sockets of ``family`` in LISTEN state on ``port``: one
    ``SOCK_DIAG_BY_FAMILY`` dump that asks for listening sockets only.

    :raises OSError: netlink or ``sock_diag`` is not available, the answer is malformed, or
        none came within a second (a sandbox that accepts the socket but never answers)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        body = _INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << _TCP_LISTEN)
        header = _NLMSG_HEADER.pack(
            _NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
        )
        nl.sendto(header + body, (0, 0))
        return _dump_answer(nl, 1, port)


def _dump_answer(nl: socket.socket, seq: int, port: int) -> set[int]:
    found: set[int] = set()
    while True:
        data = nl.recv(65536)
        offset = 0
        while offset + _NLMSG_HEADER.size <= len(data):
            length, kind, _, msg_seq, _ = _NLMSG_HEADER.unpack_from(data, offset)
            if length < _NLMSG_HEADER.size or offset + length > len(data):
                raise OSError("malformed sock_diag answer")
            if msg_seq == seq:
                if kind == _NLMSG_DONE:
                    return found
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag refused the request")
                if kind == _SOCK_DIAG_BY_FAMILY:
                    _, state, _, _, sport, *_, inode = _INET_DIAG_MSG.unpack_from(
                        data, offset + _NLMSG_HEADER.size
                    )
                    if state == _TCP_LISTEN and int.from_bytes(sport, "big") == port:
                        found.add(inode)
            offset += (length + 3) & ~3  # NLMSG_ALIGN
        if not data:
            raise OSError("sock_diag closed without an answer")


def _listening_inodes_proc(port: int, family: socket.AddressFamily) -> set[int]:
    """:func:`_listening_inodes_netlink` from ``/proc/net/tcp`` or ``tcp6`` (none if the table
    does not exist: no IPv6)."""
    found: set[int] = set()
    table = "/proc/net/tcp6" if family == socket.AF_INET6 else "/proc/net/tcp"
    try:
        lines = Path(table).read_text().splitlines()[1:]
    except FileNotFoundError:
        return found
    local_port, listen = f":{port:04X}", f"{_TCP_LISTEN:02X}"
    for line in lines:
        # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout
        # inode ...
        fields = line.split()
        if fields[3] == listen and fields[1].endswith(local_port):
            found.add(int(fields[9]))
    return found
