"""A bounded Server-Sent Events reader over a blocking byte iterator: the ``data`` of each event.

Decoding is :class:`werk.sse.SSEDecoder`'s (the one SSE parser); this reader adds a bound on the
whole stream and follows the SSE specification at the end: a partial event at the end of the
stream is dropped. An event past ``max_event_bytes``, or a stream past ``max_total_bytes``, is
refused with :class:`werk.PayloadTooLarge` before it is buffered whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..protocol import PayloadTooLarge
from ..sse import EventTooLarge, SSEDecoder

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
    decoder = SSEDecoder(max_event_bytes=max_event_bytes)
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_total_bytes:
            raise PayloadTooLarge(f"the event stream is larger than {max_total_bytes} bytes")
        try:
            events = decoder.feed(chunk)
        except EventTooLarge as exc:
            raise PayloadTooLarge(str(exc)) from None
        yield from events
