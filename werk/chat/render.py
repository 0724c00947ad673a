"""What ``werk run`` / ``werk chat`` print: the streamed reply, notes and phase diagnostics.

The reply goes to stdout, piece by piece, flushed as it arrives. Everything else goes to
stderr so that ``werk run MODEL PROMPT > answer.txt`` captures only the answer: notes (session
resumed, reply cancelled) always, phase diagnostics (``-v``) with the seconds since start.
No colour codes are written into the reply; on a terminal, a transient spinner on stderr
(:class:`WaitIndicator`) shows long waits (model load, restore and prefill before the first
token) and erases itself; in a pipe nothing extra is written.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["Diagnostics", "ReplyPrinter", "WaitIndicator"]


class Diagnostics:
    """Notes and (with ``verbose``) phase lines on stderr, prefixed ``werk:``."""

    def __init__(self, verbose: bool, stream: TextIO | None = None) -> None:
        self.verbose = verbose
        self._stream = stream
        self._t0 = time.monotonic()

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def phase(self, text: str) -> None:
        """A ``-v`` phase line: ``werk: [  1.23s] text``."""
        if self.verbose:
            elapsed = time.monotonic() - self._t0
            self.stream.write(f"werk: [{elapsed:7.2f}s] {text}\n")
            self.stream.flush()

    def note(self, text: str) -> None:
        """A line the user always sees."""
        self.stream.write(f"werk: {text}\n")
        self.stream.flush()

    def route_logs(self) -> None:
        """With ``-v``, show INFO records of the ``werk`` loggers (plugins' own phases)."""
        if not self.verbose:
            return
        logger = logging.getLogger("werk")
        if not any(getattr(h, "_werk_chat", False) for h in logger.handlers):
            handler = logging.StreamHandler(self.stream)
            handler.setFormatter(logging.Formatter("werk: %(name)s: %(message)s"))
            handler._werk_chat = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class ReplyPrinter:
    """Writes reply pieces to stdout as they come and ends the reply with one newline."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._open = False
        self._last = "\n"

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def write(self, piece: str) -> None:
        if not piece:
            return
        self.stream.write(piece)
        self.stream.flush()
        self._open = True
        self._last = piece[-1]

    def end(self) -> None:
        """Finish the current reply on its own line (nothing when nothing was written)."""
        if self._open and self._last != "\n":
            self.stream.write("\n")
            self.stream.flush()
        self._open = False
        self._last = "\n"


class WaitIndicator:
    """A transient spinner on stderr for a long wait, shown only when stderr is a terminal.

    ``start(text)`` shows it, ``stop()`` erases it (idempotent); writing the reply must wait
    for ``stop()`` so spinner and text never interleave.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._status: Any = None

    @property
    def enabled(self) -> bool:
        return bool(getattr(self._stream, "isatty", lambda: False)())

    def start(self, text: str) -> None:
        if self._status is not None or not self.enabled:
            return
        from rich.console import Console

        self._status = Console(file=self._stream).status(text, spinner="dots")
        self._status.start()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __call__(self, text: str) -> WaitIndicator:
        self.start(text)
        return self

    def __enter__(self) -> WaitIndicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
