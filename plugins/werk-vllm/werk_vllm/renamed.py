"""A relayed SSE stream whose chunks name Werk's model id instead of the endpoint's."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec

__all__ = ["RenamedStream"]


class RenamedStream:
    """Wraps an upstream payload iterator; rewrites each JSON chunk's ``model`` field.

    ``aclose()`` closes the upstream (the host always calls it when the exchange ends)."""

    def __init__(self, upstream: AsyncIterator[bytes], model_id: str) -> None:
        self._upstream = upstream
        self._model = model_id

    def __aiter__(self) -> RenamedStream:
        return self

    async def __anext__(self) -> bytes:
        payload = await self._upstream.__anext__()
        try:
            chunk = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            return payload
        if isinstance(chunk, dict) and "model" in chunk:
            chunk["model"] = self._model
            return msgspec.json.encode(chunk)
        return payload

    async def aclose(self) -> None:
        aclose = getattr(self._upstream, "aclose", None)
        if aclose is not None:
            await aclose()
