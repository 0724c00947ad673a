"""A bounded Server-Sent Events reader: bytes in, the ``data`` of each event out.

Only what an OpenAI-compatible stream uses is interpreted: ``data:`` lines (several in one
event are joined with a newline), blank lines ending an event, ``:`` comment lines; other fields
(``event``, ``id``, ``retry``) are ignored. Lines may end in ``\\n`` or ``\\r\\n``. An event whose
data grows past ``max_event_bytes``, or a stream past ``max_total_bytes``, is refused with
:class:`werk.PayloadTooLarge` before it is buffered whole; a partial event at the end of the
stream is dropped, as the SSE specification says.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..protocol import PayloadTooLarge

__all__ = ["MAX_EVENT_BYTES", "MAX_STREAM_BYTES", "sse_data"]

MAX_EVENT_BYTES = 8 * 1024 * 1024
MAX_STREAM_BYTES = 256 * 1024 * 1024


def sse_data(
    chunks: Iterable[bytes],
    *,
    max_event_bytes: int = MAX_EVENT_BYTES,
    max_total_bytes: int = MAX_STREAM_BYTES,
) -> Iterator[bytes]:
    """Yield the data of every complete event in ``chunks`` (raw bytes as received)."""
    buffer = bytearray()
    data: list[bytes] = []
    size = 0
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_total_bytes:
            raise PayloadTooLarge(f"the event stream is larger than {max_total_bytes} bytes")
        buffer += chunk
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > max_event_bytes:
                    raise PayloadTooLarge(f"an event is larger than {max_event_bytes} bytes")
                break
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    yield b"\n".join(data)
                data, size = [], 0
                continue
            if line.startswith(b":"):
                continue
            name, _, value = line.partition(b":")
            if name != b"data":
                continue
            if value.startswith(b" "):
                value = value[1:]
            size += len(value) + 1
            if size > max_event_bytes:
                raise PayloadTooLarge(f"an event is larger than {max_event_bytes} bytes")
            data.append(value)
