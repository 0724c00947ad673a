"""Signals during ``werk run`` / ``werk chat``: interrupt the work, never the cleanup.

* :func:`terminate_on_signals` makes SIGTERM and SIGHUP raise :class:`Terminated` in the main
  thread (SIGINT already raises :class:`KeyboardInterrupt`). Both are ``BaseException``, so no
  ``except Exception`` swallows them and every ``finally`` on the way out runs: that is where
  the CLI stops and reaps the runtime it started.
* :func:`signals_deferred` is for that cleanup: SIGINT, SIGTERM and SIGHUP are only recorded
  while it runs, so a second Ctrl+C cannot abandon a half-stopped runtime. When the block ends
  normally the first recorded signal is raised then; when an exception is already leaving the
  block, it wins.

Handlers can only be changed from the main thread; elsewhere both context managers do nothing.
SIGKILL cannot be caught: a killed CLI leaves its children to the operating system.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Terminated", "exit_code_for", "signals_deferred", "terminate_on_signals"]

_HANDLED = (signal.SIGTERM, signal.SIGHUP)
_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived; :attr:`signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum


def exit_code_for(exc: BaseException) -> int:
    """The conventional exit status for an interruption: 128 + the signal number."""
    if isinstance(exc, Terminated):
        return 128 + exc.signum
    return 128 + signal.SIGINT


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def terminate_on_signals() -> Iterator[None]:
    """While active, SIGTERM and SIGHUP raise :class:`Terminated` in the main thread."""
    if not _main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _raise_terminated) for sig in _HANDLED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Record SIGINT/SIGTERM/SIGHUP instead of acting on them until the block is done."""
    if not _main_thread():
        yield
        return
    pending: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, record) for sig in _DEFERRED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if pending:
        first = pending[0]
        if first == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(first)
