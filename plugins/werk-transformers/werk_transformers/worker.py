"""The Transformers companion worker, on the host's companion-worker module
(:mod:`werk.companion`).

One worker process per Werk process, started on the first request (or load) for a
``transformers`` model and reused while the server lives; it keeps an LRU of loaded models
(:envvar:`WERK_TRANSFORMERS_MODEL_CACHE_SIZE`, default 1) and runs one generation at a time:
other requests wait in line (at most :envvar:`WERK_TRANSFORMERS_MAX_WAITING`, default 8; one
more is ``429``). The protocol, the end of a worker on any failure, the cancel of a stream whose
client went away and the typed errors are the host's (:class:`werk.CompanionWorker`).
"""

from __future__ import annotations

import os
from pathlib import Path

from werk import CompanionWorker, FoundPython, werk_home, whole_number_setting

__all__ = ["CACHE_SIZE_ENV", "TransformersWorker"]

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_TRANSFORMERS_MODEL_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_TRANSFORMERS_MAX_WAITING"
DEFAULT_MAX_WAITING = 8
START_TIMEOUT_SECONDS = 180.0
KIND = "transformers"


def cache_size() -> int:
    """Models the worker keeps loaded (:data:`CACHE_SIZE_ENV`, default 1)."""
    return whole_number_setting(CACHE_SIZE_ENV, 1)


def max_waiting() -> int:
    """Requests that may wait for the busy worker (:data:`MAX_WAITING_ENV`, default 8)."""
    return whole_number_setting(MAX_WAITING_ENV, DEFAULT_MAX_WAITING)


class TransformersWorker(CompanionWorker):
    """A running Transformers worker (:ivar found: the Python it runs in)."""

    found: FoundPython

    @classmethod
    async def start(cls, found: FoundPython) -> TransformersWorker:
        """Spawn the worker and wait for its ``health`` and ``capabilities``."""
        env = dict(os.environ)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(cache_size())
        worker = await cls.spawn(
            [str(found.python), str(WORKER_SCRIPT)],
            kind=KIND,
            runs_dir=werk_home() / "backends" / f"{KIND}-runs",
            env=env,
            start_timeout=START_TIMEOUT_SECONDS,
            max_waiting=max_waiting,
            waiting_setting=MAX_WAITING_ENV,
        )
        worker.found = found
        return await worker.handshake()
