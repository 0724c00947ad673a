"""The ONNX Runtime GenAI companion worker (backend ``onnx-genai``), on the host's
companion-worker module (:mod:`werk.companion`): one per Werk process, an LRU of loaded models
(:envvar:`WERK_ONNX_GENAI_MODEL_CACHE_SIZE`, default 1), one generation at a time (at most
:envvar:`WERK_ONNX_GENAI_MAX_WAITING`, default 8, wait; one more is ``429``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from werk import CapabilityId, CompanionWorker, Unavailable, werk_home

from .environment import OnnxPython

__all__ = ["CACHE_SIZE_ENV", "OnnxWorker"]

log = logging.getLogger("werk.onnx")

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_ONNX_GENAI_MODEL_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_ONNX_GENAI_MAX_WAITING"
KIND = "onnx-genai"


def _whole_number(name: str, default: int) -> int:
    raw = os.environ.get(name, str(default))
    if not raw.isdigit():
        raise Unavailable(
            f"{name}={raw!r} is not a whole number >= 0",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    return int(raw)


class OnnxWorker(CompanionWorker):
    """A running ONNX Runtime GenAI worker.

    :ivar found: the Python it runs in. :ivar versions: its libraries' versions.
    :ivar capacity: the models its LRU keeps.
    """

    found: OnnxPython
    versions: dict[str, str]
    capacity: int

    @classmethod
    async def start(cls, found: OnnxPython) -> OnnxWorker:
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(_whole_number(CACHE_SIZE_ENV, 1))
        worker = await cls.spawn(
            [str(found.python), str(WORKER_SCRIPT)],
            kind=KIND,
            runs_dir=werk_home() / "backends" / f"{KIND}-runs",
            env=env,
            start_timeout=120.0,
            max_waiting=lambda: _whole_number(MAX_WAITING_ENV, 8),
            waiting_setting=MAX_WAITING_ENV,
        )
        worker.found = found
        worker.versions = dict(worker.health.get("versions") or {})
        try:
            worker.capacity = int((await worker.request("capabilities", {}))["cache_size"])
        except BaseException:
            await worker.stop()
            raise
        log.info("onnx-genai worker %s ready (%s)", worker.process.pid, worker.versions)
        return worker
