"""A model's execution lane: its engine's calls, one at a time, each in a worker thread.

A llama.cpp context is not thread-safe and a prompt's evaluation takes seconds on a CPU, so
every call into the engine runs through :meth:`Lane.run` (a one-slot semaphore, then
``anyio.to_thread.run_sync``): the event loop never blocks, and concurrent requests for the same
model wait their turn — queued by Werk, never refused. A streamed generation holds the lane
from its first token to its end (:class:`LaneGeneration`), each token one thread call; when the
client goes away the host closes it, the generation is stopped between two tokens and the lane
is free again. Cleanup is shielded from cancellation: a lane is never left held.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Self, TypeVar

import anyio

from .engine import Engine

__all__ = ["Lane", "LaneGeneration"]

T = TypeVar("T")


class Lane:
    """The one way into an :class:`Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._slot = anyio.Semaphore(1)  # released by whichever task ends a stream

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in a worker thread, after every earlier call ended."""
        async with self._slot:
            return await anyio.to_thread.run_sync(work, *args)

    def generation(
        self, start: Callable[[], Iterator[dict[str, Any]]], *, whole: bool = False
    ) -> LaneGeneration:
        """A generation to enter with ``async with``; ``start()`` makes its event iterator on the
        lane (e.g. ``lambda: engine.generation(tokens, ...)``). ``whole``: run it to its end in
        one thread call on entering (a reply that is not streamed: no hop per token)."""
        return LaneGeneration(self, start, whole)


class LaneGeneration:
    """A :class:`werk.GenerationEvents` over the engine's generation, holding the lane."""

    def __init__(
        self, lane: Lane, start: Callable[[], Iterator[dict[str, Any]]], whole: bool = False
    ) -> None:
        self._lane = lane
        self._start = start
        self._whole = whole
        self._events: Iterator[dict[str, Any]] | None = None
        self.result: dict[str, Any] | None = None

    def _run_whole(self) -> Iterator[dict[str, Any]]:
        events = list(self._start())
        return iter(events)

    async def __aenter__(self) -> Self:
        await self._lane._slot.acquire()
        try:
            self._events = await anyio.to_thread.run_sync(
                self._run_whole if self._whole else self._start
            )
        except BaseException:
            self._lane._slot.release()
            raise
        return self

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> dict[str, Any]:
        assert self._events is not None, "enter the generation first"
        if self._whole:
            event = next(self._events, None)
        else:
            event = await anyio.to_thread.run_sync(next, self._events, None)
        if event is None:
            self.result = self._lane.engine.result
            raise StopAsyncIteration
        return event

    async def __aexit__(self, *exc_info: object) -> None:
        events, self._events = self._events, None
        try:
            if events is not None and hasattr(events, "close"):
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(events.close)
        finally:
            self._lane._slot.release()
