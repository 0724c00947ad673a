"""The media companion worker, on the host's companion-worker module (:mod:`werk.companion`).

One worker process per kind (``media``: the generic Diffusers/Transformers worker;
``qwen-tts``: the Qwen3-TTS worker, in its own environment) per Werk process, started on the
first request for a model of that kind and reused while the server lives. The protocol, the
one-request-at-a-time rule, the end of a worker on any failure and the typed errors are the
host's (:class:`werk.CompanionWorker`); this module adds what the media worker answers at start
(``health`` versions, ``capabilities``: its LRU capacity and features) and its settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from werk import CompanionWorker, WorkerGone, werk_home, whole_number_setting

from .environment import MediaPython

__all__ = ["MediaWorker", "WorkerGone"]

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_MEDIA_PIPELINE_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_MEDIA_MAX_WAITING"
DEFAULT_MAX_WAITING = 8
"""Requests that may wait for a busy worker (one runs at a time); one more is ``429``."""
START_TIMEOUT_SECONDS = 180.0


def cache_size() -> int:
    """Pipelines each worker keeps (:data:`CACHE_SIZE_ENV`, default 1)."""
    return whole_number_setting(CACHE_SIZE_ENV, 1)


def max_waiting() -> int:
    """How many requests may wait for a busy worker (:data:`MAX_WAITING_ENV`, default 8)."""
    return whole_number_setting(MAX_WAITING_ENV, DEFAULT_MAX_WAITING)


class MediaWorker(CompanionWorker):
    """A running media companion worker.

    :ivar found: the Python it runs in (and where that came from).
    :ivar features: what its environment can do beyond the tasks (``capabilities``).
    """

    found: MediaPython
    features: dict[str, dict[str, str]]

    @classmethod
    async def start(cls, found: MediaPython, kind: str = "media") -> MediaWorker:
        """Spawn the worker of ``kind`` and wait for its ``health`` and ``capabilities``."""
        env = dict(os.environ)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(cache_size())
        worker = await cls.spawn(
            [str(found.python), str(WORKER_SCRIPT)],
            kind=kind,
            runs_dir=werk_home() / "backends" / f"{kind}-runs",
            env=env,
            start_timeout=START_TIMEOUT_SECONDS,
            max_waiting=max_waiting,
            waiting_setting=MAX_WAITING_ENV,
        )
        worker.found = found
        await worker.handshake()
        worker.features = dict(worker.capabilities.get("features") or {})
        return worker
