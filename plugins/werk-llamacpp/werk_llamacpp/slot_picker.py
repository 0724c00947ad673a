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
        busy, used, keys = self._busy, self._used, self._key
        least = min(busy.values())
        # The affinity counts only a shared prefix over llama-server's default similarity
        # threshold (10 % of the prompt; shared chat-JSON boilerplate alone does not count).
        # One loop, no helper calls: this runs for every /v1 request.
        threshold = SIMILARITY * len(key)
        slot, best = -1, (-1, 0.0)
        for candidate in self.slots:
            if busy[candidate] != least:
                continue
            common = _common_prefix(key, keys[candidate])
            rank = (common if common > threshold else 0, -used[candidate])
            if rank > best:
                slot, best = candidate, rank
        busy[slot] += 1
        used[slot] = time.monotonic()
        keys[slot] = key
        return slot

    def release(self, slot: int) -> None:
        if self._busy.get(slot, 0) > 0:
            self._busy[slot] -= 1

    def in_flight(self) -> int:
        return sum(self._busy.values())
