"""The chat-session cache: saved KV states of recent conversations, reused by longest prefix.

A llama.cpp context holds one sequence. When conversations alternate (two users, or a named
state's prefill in between), the context's tokens no longer start with the next request's
prompt; the session cache keeps the sequence state of recent requests (:class:`Saved`: the
tokens and the bytes ``llama_state_seq_get_data`` gave) so the next turn of any of them restores
the best one and evaluates only what follows it. The engine trims a restored or live sequence to
the shared prefix (``Llama.generate`` does) — a session is kept and trimmed, never evaluated
again from the start.

Bounded by entries and bytes (the bytes are part of the runtime's memory requirement); the least
recently used entry goes first; an entry whose tokens are a prefix of a newer one is dropped (the
newer one serves the same prompts). Not thread-safe: only the model's lane touches it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Saved", "SessionCache", "shared_prefix"]


@dataclass(frozen=True)
class Saved:
    """One sequence state: the tokens it holds and llama.cpp's bytes for them."""

    tokens: tuple[int, ...]
    data: bytes


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class SessionCache:
    """At most ``max_entries`` saved sequences, ``max_bytes`` of state in all."""

    def __init__(self, *, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], Saved] = OrderedDict()
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, tokens: Sequence[int]) -> tuple[Saved, int] | None:
        """The entry sharing the longest prefix with ``tokens`` (and that length), or ``None``
        when none shares any; the entry becomes the most recently used."""
        found: tuple[Saved, int] | None = None
        for saved in self._entries.values():
            common = shared_prefix(saved.tokens, tokens)
            if common > 0 and (found is None or common > found[1]):
                found = (saved, common)
        if found is not None:
            self._entries.move_to_end(found[0].tokens)
        return found

    def put(self, saved: Saved) -> bool:
        """Keep ``saved``; ``False`` when it alone is over the byte bound (not kept)."""
        size = len(saved.data)
        if not saved.tokens or size > self.max_bytes or self.max_entries == 0:
            return False
        for tokens in [t for t in self._entries if saved.tokens[: len(t)] == t]:
            self._drop(tokens)
        self._entries[saved.tokens] = saved
        self.nbytes += size
        while len(self._entries) > self.max_entries or self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))
        return True

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, tokens: tuple[int, ...]) -> None:
        dropped = self._entries.pop(tokens)
        self.nbytes -= len(dropped.data)
