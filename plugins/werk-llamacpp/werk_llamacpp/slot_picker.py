"""Which general slot each ``/v1`` request goes to (never a slot reserved for named states).

llama-server would otherwise pick any idle slot, including the one holding a named state; the
picker keeps llama-server's own preferences among the general slots.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = ["SlotPicker"]

PREFIX_KEY_CHARS = 8192
SIMILARITY = 0.1


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:  # the same prompt, or one that extends the other (the next turn)
        return hi
    while lo < hi:  # binary search on slice equality (C-speed comparisons)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SlotPicker:
    """Chooses the slot for each ``/v1`` request among the general slots (never a state slot).

    llama-server would otherwise pick any idle slot, including the one holding a named state.
    The picker keeps llama-server's own preferences: an idle slot whose last prompt shares the
    longest prefix with this one (over 10 % of it, so ``cache_prompt`` reuse still works), else
    the least recently used idle slot; when every slot is busy, the least loaded one
    (llama-server queues the request until that slot frees up).
    """

    def __init__(self, slots: Sequence[int]) -> None:
        if not slots:
            raise ValueError("no general slots")
        self.slots = tuple(slots)
        self._busy = dict.fromkeys(self.slots, 0)
        self._used = dict.fromkeys(self.slots, 0.0)
        self._key = dict.fromkeys(self.slots, "")

    def acquire(self, key: str) -> int:
        key = key[:PREFIX_KEY_CHARS]
        least = min(self._busy.values())
        candidates = [s for s in self.slots if self._busy[s] == least]
        slot = max(candidates, key=lambda s: (self._affinity(key, s), -self._used[s]))
        self._busy[slot] += 1
        self._used[slot] = time.monotonic()
        self._key[slot] = key
        return slot

    def _affinity(self, key: str, slot: int) -> int:
        """The shared prefix, if it is more than llama-server's default similarity threshold
        (10 % of the prompt; shared chat-JSON boilerplate alone does not count)."""
        common = _common_prefix(key, self._key[slot])
        return common if common > SIMILARITY * len(key) else 0

    def release(self, slot: int) -> None:
        if self._busy.get(slot, 0) > 0:
            self._busy[slot] -= 1

    def in_flight(self) -> int:
        return sum(self._busy.values())
