"""What ``werk run`` / ``werk chat`` print: the streamed reply, notes and phase diagnostics.

The reply goes to stdout, piece by piece, flushed as it arrives. Everything else goes to
stderr so that ``werk run MODEL PROMPT > answer.txt`` captures only the answer: notes (session
resumed, reply cancelled) always, phase diagnostics (``-v``) with the seconds since start.
No colour codes are written; the text is the same on a terminal and in a pipe.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

__all__ = ["Diagnostics", "ReplyPrinter"]


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
