"""Server-Sent Events decoding: bytes in, the ``data`` of each event out. The one SSE parser.

:class:`SSEDecoder` is incremental (feed it chunks split anywhere) and bounded (an event larger
than ``max_event_bytes`` is refused before it is buffered whole). Only what an
OpenAI-compatible stream uses is interpreted: ``data:`` lines (several in one event are joined
with a newline), blank lines ending an event, ``:`` comment lines, and ``event: error`` (whose
data is handed out as an ``{"error": …}`` object when it is not one already, so that a caller
needs to look at the data only). ``id``, ``retry`` and other event names are ignored. Lines may
end in ``\\n`` or ``\\r\\n``.

The relay to a backend (:mod:`werk.upstream`) and the terminal chat's reader
(:mod:`werk.chat.sse`) both decode with it.
"""

from __future__ import annotations

__all__ = ["MAX_EVENT_BYTES", "EventTooLarge", "SSEDecoder"]

MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLarge(ValueError):
    """One event (or one unterminated line) grew past the decoder's bound."""


class SSEDecoder:
    """An incremental SSE decoder; see the module docstring.

    :param max_event_bytes: the largest event (and the longest line) accepted.
    """

    __slots__ = ("_buffer", "_data", "_error", "_size", "max_event_bytes")

    def __init__(self, *, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self._buffer = b""
        self._data: list[bytes] = []
        self._size = 0
        self._error = False

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event that ``chunk`` completes, in order.

        :raises EventTooLarge: an event or a line is larger than ``max_event_bytes``.
        """
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\n" not in buffer:
            if len(buffer) > self.max_event_bytes:
                raise EventTooLarge(f"an event is larger than {self.max_event_bytes} bytes")
            self._buffer = buffer
            return []
        *lines, self._buffer = buffer.split(b"\n")
        if len(self._buffer) > self.max_event_bytes:
            raise EventTooLarge(f"an event is larger than {self.max_event_bytes} bytes")
        events: list[bytes] = []
        for line in lines:
            self._line(line, events)
        return events

    def end(self) -> list[bytes]:
        """At the end of the stream: the event still open, if its last line was complete or
        only lacked its newline (lenient: a server that closes right after ``data: x``)."""
        events: list[bytes] = []
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            if self._data:
                payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                if self._error and not payload.startswith(b'{"error"'):
                    payload = b'{"error":' + (payload if payload.startswith(b"{") else b"{}") + b"}"
                events.append(payload)
            self._data = []
            self._size = 0
            self._error = False
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self._size += len(value) + 1
            if self._size > self.max_event_bytes:
                raise EventTooLarge(f"an event is larger than {self.max_event_bytes} bytes")
            self._data.append(value)
        elif line.startswith(b"event:"):
            self._error = line[6:].strip() == b"error"
        # comments (":" pings), id:, retry: and unknown fields carry nothing Werk relays
