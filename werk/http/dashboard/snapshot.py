"""What one dashboard update carries: the server's state as one signed-in caller may see it.

Everything comes from the same control operations the ``/werk/v1`` and ``/v1`` routes answer
with (so the page never shows what the API would not): the capability matrix, memory,
configured models and loaded runtimes (server-wide, as ``GET /werk/v1/runtimes`` is), and the
caller's own states, jobs, reuse figures and recent requests.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...control.interface import StateQuery, WerkControl
from ...memory.pressure import EMERGENCY_THRESHOLD, HARD_THRESHOLD, SOFT_THRESHOLD
from ...protocol import JobRecord
from ..activity import Activity

__all__ = ["MAX_JOBS", "MAX_STATES", "Snapshots"]

MAX_STATES = 200
"""The most states one update lists (the page says when there are more)."""
MAX_JOBS = 24
"""The most recent jobs one update lists."""
CAPABILITY_EVERY = 5
"""The capability matrix is asked for on every this-many-th update (it asks every backend)."""

_PROMPT_CHARS = 120
_THRESHOLDS = {
    "soft": int(SOFT_THRESHOLD * 100),
    "hard": int(HARD_THRESHOLD * 100),
    "emergency": int(EMERGENCY_THRESHOLD * 100),
}


def _job_row(record: JobRecord) -> dict[str, Any]:
    request = record.request or {}
    prompt = request.get("prompt", request.get("input"))
    return {
        "id": record.id,
        "kind": record.kind,
        "status": record.status,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "model": request.get("model"),
        "prompt": prompt[:_PROMPT_CHARS] if isinstance(prompt, str) else None,
        "error": record.error.message if record.error is not None else None,
        "output": msgspec.to_builtins(record.output) if record.output is not None else None,
    }


class Snapshots:
    """Builds the updates of one dashboard stream (it remembers the last capability matrix)."""

    def __init__(self, control: WerkControl, activity: Activity, principal: str) -> None:
        self._control = control
        self._activity = activity
        self._principal = principal
        self._count = 0
        self._capabilities: Any = None

    async def next(self) -> dict[str, Any]:
        control, principal = self._control, self._principal
        if self._count % CAPABILITY_EVERY == 0 or self._capabilities is None:
            self._capabilities = (await control.capabilities()).capabilities
        self._count += 1
        info = await control.info()
        states = await control.list_states(principal, StateQuery(limit=MAX_STATES))
        jobs = sorted(await control.jobs(principal), key=lambda r: (r.created_at, r.id))
        return {
            "werk_version": info.werk_version,
            "auth": info.server.auth,
            "started_at": info.server.started_at,
            "capabilities": self._capabilities,
            "memory": await control.memory(),
            "thresholds": _THRESHOLDS,
            "models": (await control.models()).models,
            "runtimes": await control.runtimes_listing(),
            "states": states.states,
            "more_states": states.next_cursor is not None,
            "jobs": [_job_row(record) for record in reversed(jobs[-MAX_JOBS:])],
            "stats": await control.stats(principal),
            "activity": self._activity.recent(principal),
        }
