"""``werk chat`` (or any ``werk`` command) on a real pseudo-terminal, for end-to-end tests.

:class:`PtyChat` runs the ``werk`` console script as the session leader of a new pty, so
``send("\\x03")`` is a real Ctrl+C and ``send("\\x04")`` a real Ctrl+D, exactly as when a person
types them; :meth:`PtyChat.expect` waits for text on the screen. Linux only (``setsid -c``).
A stuck process fails the test after :data:`HANG_GUARD` seconds (a hang guard, not a timing
check).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from .server import WERK

__all__ = ["HANG_GUARD", "PtyChat"]

HANG_GUARD = 60.0
"""Seconds after which a stuck subprocess fails the test."""


def _fail(message: str) -> NoReturn:
    raise AssertionError(message)


class PtyChat:
    """``werk chat …`` on a pseudo-terminal that is its controlling terminal.

    ``setsid -c`` makes the child a session leader with the pty as controlling terminal, so
    writing ``\\x03`` is a real Ctrl+C (the line discipline sends SIGINT to the foreground
    process group) and ``\\x04`` a real Ctrl+D, exactly as when a person types them.
    """

    def __init__(
        self, args: Sequence[str], env: Mapping[str, str], *, werk: Path | None = None
    ) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.proc = subprocess.Popen(
            ["setsid", "-c", str(werk or WERK), *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env={**env, "TERM": "xterm"},
        )
        os.close(slave)
        self.master = master
        self.output = bytearray()

    def expect(self, needle: str | bytes, count: int = 1) -> None:
        """Wait until ``needle`` has appeared ``count`` times in the whole transcript."""
        raw = needle.encode() if isinstance(needle, str) else needle
        guard = time.monotonic() + HANG_GUARD
        while self.output.count(raw) < count:
            ready, _, _ = select.select([self.master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # EIO: the terminal has no writer any more
                    data = b""
                if not data:
                    _fail(f"terminal closed before {raw!r} x{count}:\n{self.text()}")
                self.output += data
            elif self.proc.poll() is not None:
                _fail(f"exit {self.proc.returncode} before {raw!r} x{count}:\n{self.text()}")
            if time.monotonic() > guard:
                self.proc.kill()
                _fail(f"{raw!r} did not appear {count} times:\n{self.text()}")

    def send(self, data: str) -> None:
        os.write(self.master, data.encode())

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait(self) -> int:
        """Drain the terminal until the process exits; return its status."""
        guard = time.monotonic() + HANG_GUARD
        while self.proc.poll() is None:
            ready, _, _ = select.select([self.master], [], [], 0.2)
            if ready:
                with contextlib.suppress(OSError):
                    self.output += os.read(self.master, 65536)
            if time.monotonic() > guard:
                self.proc.kill()
                _fail(f"werk chat did not exit:\n{self.text()}")
        return self.proc.returncode

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
