"""A decode's text handed on as the backend generates it: a streamed persisted chat turn."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..protocol import BackendError
from ..state.handoffs import CompletionBuffer

__all__ = ["StreamedText"]


class StreamedText:
    """A decode's text handed on as the backend generates it (``DecodeCall.on_text``): never
    more than the 1 MiB bound (past it the decode fails, as an unstreamed one does), and
    completed from the returned text where the backend streamed less than all of it."""

    def __init__(self, on_text: Callable[[str], Awaitable[None]]) -> None:
        self._on_text = on_text
        self._sent = CompletionBuffer()

    async def piece(self, text: str) -> None:
        """One piece from the backend. :raises werk.BackendError: past the bound."""
        if text:
            self._sent.append(text)
            await self._on_text(text)

    async def rest(self, text: str) -> None:
        """The decode returned ``text``: send what the pieces left out.

        :raises werk.BackendError: the pieces are not the start of ``text``."""
        sent = self._sent.text()
        if not text.startswith(sent):
            raise BackendError("the backend's streamed text differs from the text it returned")
        if len(text) > len(sent):
            await self._on_text(text[len(sent) :])
