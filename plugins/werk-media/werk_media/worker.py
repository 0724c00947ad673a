"""The media companion worker, on the host's companion-worker module (:mod:`werk.companion`).

One worker process per kind (``media``: the generic Diffusers/Transformers worker;
``qwen-tts``: the Qwen3-TTS worker, in its own environment) per Werk process, started on the
first request for a model of that kind and reused while the server lives. The protocol, the
one-request-at-a-time rule, the end of a worker on any failure and the typed errors are the
host's (:class:`werk.CompanionWorker`); this module adds what the media worker answers at start
(``health`` versions, ``capabilities``: its LRU capacity and features) and its settings.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from werk import CapabilityId, CompanionWorker, Unavailable, WorkerGone, werk_home

from .environment import MediaPython

__all__ = ["MediaWorker", "WorkerGone"]

log = logging.getLogger("werk.media")

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_MEDIA_PIPELINE_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_MEDIA_MAX_WAITING"
DEFAULT_MAX_WAITING = 8
"""Requests that may wait for a busy worker (one runs at a time); one more is ``429``."""
START_TIMEOUT_SECONDS = 180.0


def _whole_number(name: str, default: int) -> int:
    """The environment variable ``name`` as a whole number >= 0 (``default`` when unset)."""
    raw = os.environ.get(name, str(default))
    if not raw.isdigit():
        raise Unavailable(
            f"{name}={raw!r} is not a whole number >= 0",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    return int(raw)


def cache_size() -> int:
    """Pipelines each worker keeps (:data:`CACHE_SIZE_ENV`, default 1)."""
    return _whole_number(CACHE_SIZE_ENV, 1)


def max_waiting() -> int:
    """How many requests may wait for a busy worker (:data:`MAX_WAITING_ENV`, default 8)."""
    return _whole_number(MAX_WAITING_ENV, DEFAULT_MAX_WAITING)


class MediaWorker(CompanionWorker):
    """A running media companion worker.

    :ivar found: the Python it runs in (and where that came from).
    :ivar versions: its libraries' versions (from ``health``).
    :ivar capacity: the pipelines its LRU keeps.
    :ivar features: what its environment can do beyond the tasks (``capabilities``).
    """

    found: MediaPython
    versions: dict[str, str]
    capacity: int
    features: dict[str, dict[str, str]]

    @classmethod
    async def start(cls, found: MediaPython, kind: str = "media") -> MediaWorker:
        """Spawn the worker of ``kind`` and wait for its ``health`` and ``capabilities``."""
        env = dict(os.environ)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(cache_size())
        worker = await cls.spawn(
            [found.python, str(WORKER_SCRIPT)],
            kind=kind,
            runs_dir=werk_home() / "backends" / f"{kind}-runs",
            env=env,
            start_timeout=START_TIMEOUT_SECONDS,
            max_waiting=max_waiting,
            waiting_setting=MAX_WAITING_ENV,
        )
        worker.found = found
        worker.versions = dict(worker.health.get("versions") or {})
        try:
            capabilities = await worker.request("capabilities", {})
        except BaseException:
            await worker.stop()
            raise
        worker.capacity = int(capabilities["cache_size"])
        worker.features = dict(capabilities.get("features") or {})
        log.info(
            "%s worker %s ready (%s, from %s)",
            kind,
            worker.process.pid,
            ", ".join(f"{k} {v}" for k, v in worker.versions.items()),
            found.source,
        )
        return worker
