"""The worker side of Werk's companion-worker protocol (standard library only).

A companion worker runs in its own Python (a managed environment without Werk installed), so it
cannot import ``werk``: the host passes this file's directory in ``WERK_COMPANION_FRAMES``
(:func:`werk.companion.spawn_companion` does), and the worker script does::

    sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
    from werk_companion_frames import RequestError, serve

    serve(handle)  # handle(op, args) -> dict, or raise RequestError(kind, message)

One request at a time over stdio, one JSON object per line (transport version 1):

* request ``{"v": 1, "id": "r1", "op": OP, "args": {...}}``
* reply ``{"v": 1, "id": "r1", "ok": true, "result": {...}}`` or
  ``{"v": 1, "id": "r1", "ok": false, "error": {"kind": KIND, "message": TEXT}}``

**Streaming.** A handler that returns a generator streams: each dict it yields is sent as an
event ``{"v": 1, "id": "r1", "event": {...}}`` and the dict it returns is the reply's result.
While it streams, the host may send ``{"v": 1, "id": "r1", "op": "cancel"}`` (its caller went
away): the generator is closed at its next yield (``GeneratorExit`` there: stop the work in a
``finally``) and the reply is ``ok`` with ``{"cancelled": true}`` and whatever
``cancel_result()`` returns, so the worker stays warm for the next request.

:class:`LoadedLRU` keeps what the worker loaded between requests (a bounded LRU whose
entries report their bytes to the host through ``resident``). :class:`GeneratedText` turns
generated token ids into the ``{"text", "ids"}`` events a text generation streams (the host's
:func:`werk.generation_reply` reads them); a per-request runner can use it too, and
:func:`run_once` speaks the runner contract (:mod:`werk.runner`) for a Python runner.

Error kinds: ``invalid`` (the request was at fault), ``unsupported``, ``version`` (a frame of
another transport version), ``failed`` (anything else the handler raised; its repr goes to the
worker's log). The host ends the worker after any error reply and never sends an ``execute``
twice. Protocol frames go to the original stdout; file descriptor 1 is pointed at stderr first,
so whatever libraries print lands in the worker's log, never in the protocol.
"""

from __future__ import annotations

import collections
import io
import json
import os
import select
import sys
import types
from collections.abc import Callable, Container, Generator, Iterable, Iterator
from typing import Any

__all__ = [
    "TRANSPORT_VERSION",
    "GeneratedText",
    "LoadedLRU",
    "RequestError",
    "has_chat_template",
    "run_once",
    "serve",
]

TRANSPORT_VERSION = 1
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


class RequestError(Exception):
    """A request this worker cannot serve (reported, then the host ends the worker)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class LoadedLRU:
    """What a worker keeps loaded between requests, least recently used first.

    :param capacity: entries kept after a request (0: nothing stays; one is still loaded for
        the request that needs it).
    :param load: ``load(key) -> (value, facts)``: load an entry; ``facts`` (a dict with at
        least ``bytes``) is reported in :meth:`resident`.
    :param released: called after an entry was dropped (e.g. ``gc.collect()`` and
        ``malloc_trim``), with no reference to it left here.

    An entry is evicted *before* the next one loads (a lower peak), and after a request until
    at most ``capacity`` remain (:meth:`after_request`).
    """

    def __init__(
        self,
        capacity: int,
        load: Callable[[str], tuple[Any, dict[str, Any]]],
        released: Callable[[], None] = lambda: None,
    ) -> None:
        self.capacity = max(capacity, 0)
        self._load = load
        self._released = released
        self._entries: collections.OrderedDict[str, tuple[Any, dict[str, Any]]] = (
            collections.OrderedDict()
        )

    def resident(self) -> list[dict[str, Any]]:
        """``[{"path": key, **facts}]``, least recently used first (the host's residency)."""
        return [{"path": key, **facts} for key, (_, facts) in self._entries.items()]

    def get(self, key: str) -> Any:
        """The loaded value of ``key``, loading it (after evicting the oldest) if needed."""
        if key in self._entries:
            self._entries.move_to_end(key)
            return self._entries[key][0]
        while self._entries and len(self._entries) >= max(self.capacity, 1):
            self.drop(next(iter(self._entries)))
        self._entries[key] = self._load(key)
        return self._entries[key][0]

    def drop(self, key: str) -> bool:
        """Drop ``key``; whether it was loaded."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        del entry
        self._released()
        return True

    def after_request(self) -> None:
        """Evict until at most ``capacity`` entries remain."""
        while len(self._entries) > self.capacity:
            self.drop(next(iter(self._entries)))


class GeneratedText:
    """The text of a generation as its tokens arrive, cut into stream events.

    :param decode: ``decode(ids) -> str`` (the tokenizer's, special tokens skipped).
    :param stops: strings that end the generation (not included in the text).

    :meth:`add` returns the next event (``{"text": DELTA, "ids": NEW_TOKEN_IDS}``) or ``None``
    while nothing can be sent yet: text that could still become a stop string, or a partial
    UTF-8 sequence (``\ufffd`` at the end), is held back. :attr:`stopped` says a stop string was
    reached (the text is cut before it); :meth:`rest` is the final event, if any. :meth:`follow`
    does all of it for a generation's token iterator.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: list[str]) -> None:
        self._decode = decode
        self._stops = [stop for stop in stops if stop]
        self._hold = max((len(stop) for stop in self._stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.stopped = False
        self.finish = "length"
        self._sent = 0
        self._emitted = 0

    def _event(self, end: int) -> dict[str, Any]:
        event = {"text": self.text[self._sent : end], "ids": self.ids[self._emitted :]}
        self._sent, self._emitted = end, len(self.ids)
        return event

    def add(self, token: int) -> dict[str, Any] | None:
        self.ids.append(int(token))
        self.text = self._decode(self.ids)
        found = [i for i in (self.text.find(stop) for stop in self._stops) if i >= 0]
        if found:
            self.text, self.stopped = self.text[: min(found)], True
            return self.rest()
        ready = len(self.text) - self._hold
        while ready > self._sent and self.text[ready - 1] == "\ufffd":
            ready -= 1
        return self._event(ready) if ready > self._sent else None

    def rest(self) -> dict[str, Any] | None:
        """What was held back (at the end of the generation)."""
        if len(self.text) > self._sent or len(self.ids) > self._emitted:
            return self._event(len(self.text))
        return None

    def follow(
        self, tokens: Iterable[int], eos: Container[int], budget: int
    ) -> Iterator[dict[str, Any]]:
        """The events of a generation's ``tokens`` until an end-of-sequence token, a stop
        string or ``budget`` tokens; then :attr:`finish` is ``"stop"`` or ``"length"``."""
        self.finish = "length"
        for token in tokens:
            if token in eos:
                self.finish = "stop"
                break
            event = self.add(token)
            if event is not None:
                yield event
            if self.stopped:
                self.finish = "stop"
                break
            if len(self.ids) >= budget:
                break
        rest = self.rest()
        if rest is not None:
            yield rest


def _protocol_stream() -> io.TextIOWrapper:
    frames = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return io.TextIOWrapper(os.fdopen(frames, "wb", buffering=0), encoding="utf-8", newline="\n")


class _Lines:
    """Lines from a file descriptor, readable without blocking (a cancel while streaming)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self.closed = False

    def _fill(self) -> None:
        chunk = os.read(self._fd, 1 << 16)
        if chunk:
            self._buffer += chunk
        else:
            self.closed = True

    def readline(self, wait: bool = True) -> bytes | None:
        """The next line; ``None`` at the end, or (``wait`` false) when none is ready."""
        while b"\n" not in self._buffer and not self.closed:
            if not wait and not select.select([self._fd], [], [], 0)[0]:
                return None
            self._fill()
        if b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            return line + b"\n"
        line, self._buffer = self._buffer, b""
        return line or None


def _failure(request_id: Any, kind: str, message: str) -> dict[str, Any]:
    error = {"kind": kind, "message": message}
    return {"v": TRANSPORT_VERSION, "id": request_id, "ok": False, "error": error}


def _write(frames: io.TextIOWrapper, frame: dict[str, Any]) -> None:
    frames.write(json.dumps(frame) + "\n")
    frames.flush()


def _cancelled(lines: _Lines, request_id: Any) -> bool:
    """Whether the host asked to cancel ``request_id`` (anything else it sent is a fault)."""
    line = lines.readline(wait=False)
    if line is None:
        return lines.closed
    frame = json.loads(line)
    if frame.get("op") != "cancel" or frame.get("id") != request_id:
        raise RequestError("invalid", "a request arrived while another one was streaming")
    return True


def _stream(
    events: Generator[dict[str, Any], None, Any],
    request_id: Any,
    frames: io.TextIOWrapper,
    lines: _Lines,
    cancel_result: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    while True:
        try:
            event = next(events)
        except StopIteration as stop:
            return dict(stop.value or {})
        _write(frames, {"v": TRANSPORT_VERSION, "id": request_id, "event": event})
        if _cancelled(lines, request_id):
            events.close()
            return {"cancelled": True, **cancel_result()}


def serve(
    handle: Callable[[str, dict[str, Any]], dict[str, Any] | Iterator[dict[str, Any]]],
    cancel_result: Callable[[], dict[str, Any]] = dict,
) -> None:
    """Answer requests from stdin until it closes.

    :param handle: ``handle(op, args)``: a result dict, or a generator that streams (above).
    :param cancel_result: what a cancelled stream's result adds (e.g. ``resident``).
    """
    frames = _protocol_stream()
    lines = _Lines(sys.stdin.fileno())
    while (line := lines.readline()) is not None:
        if not line.strip():
            continue
        request_id: Any = None
        try:
            frame = json.loads(line)
            request_id = frame.get("id")
            if frame.get("v") != TRANSPORT_VERSION:
                raise RequestError("version", f"transport version {frame.get('v')!r} is not 1")
            if frame.get("op") == "cancel":
                continue  # it crossed the end of the stream it meant: nothing runs now
            result = handle(str(frame.get("op")), dict(frame.get("args") or {}))
            if isinstance(result, types.GeneratorType):
                result = _stream(result, request_id, frames, lines, cancel_result)
            reply: dict[str, Any] = {
                "v": TRANSPORT_VERSION,
                "id": request_id,
                "ok": True,
                "result": result,
            }
        except RequestError as exc:
            reply = _failure(request_id, exc.kind, str(exc))
        except Exception as exc:  # a failed handler: reported, then the host ends this worker
            print(f"request {request_id} failed: {exc!r}", file=sys.stderr, flush=True)
            reply = _failure(request_id, "failed", f"{type(exc).__name__}: {exc}")
        _write(frames, reply)


def has_chat_template(folder: str) -> bool:
    """Whether a model folder's tokenizer has a chat template (``chat_template.jinja``,
    ``chat_template.json`` or ``tokenizer_config.json``'s ``chat_template``)."""
    if any(os.path.isfile(os.path.join(folder, name)) for name in CHAT_TEMPLATE_FILES):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def run_once(generate: Callable[[dict[str, Any]], Generator[dict[str, Any], None, Any]]) -> None:
    """A Python runner's whole life (the runner contract of :mod:`werk.runner`): read one JSON
    request from stdin, stream ``generate(request)``'s events as ``delta`` lines, then its
    result as the ``done`` line — or, for a result ``{"refused": TEXT}``, an ``invalid`` error
    (exit 2); an exception is an ``error`` line (its traceback goes to stderr, exit 1). What
    the libraries print goes to stderr, never into the protocol."""
    frames = _protocol_stream()
    try:
        request = json.loads(sys.stdin.readline())
        events = generate(request)
        while True:
            try:
                event = next(events)
            except StopIteration as stop:
                result = dict(stop.value or {})
                break
            _write(frames, {"delta": event["text"], "ids": event.get("ids", [])})
    except Exception as exc:
        import traceback

        traceback.print_exc()
        _write(frames, {"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
    if "refused" in result:
        _write(frames, {"error": str(result["refused"]), "kind": "invalid"})
        sys.exit(2)
    _write(frames, {"done": True, **result})
    sys.exit(0)
