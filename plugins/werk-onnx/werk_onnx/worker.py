"""The ONNX Runtime GenAI companion worker (backend ``onnx-genai``), on the host's
companion-worker module (:mod:`werk.companion`): one per Werk process, an LRU of loaded models
(:envvar:`WERK_ONNX_GENAI_MODEL_CACHE_SIZE`, default 1), one generation at a time (at most
:envvar:`WERK_ONNX_GENAI_MAX_WAITING`, default 8, wait; one more is ``429``)."""

from __future__ import annotations

import os
from pathlib import Path

from werk import CompanionWorker, FoundPython, werk_home, whole_number_setting

__all__ = ["CACHE_SIZE_ENV", "OnnxWorker"]

WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_ONNX_GENAI_MODEL_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_ONNX_GENAI_MAX_WAITING"
KIND = "onnx-genai"


class OnnxWorker(CompanionWorker):
    """A running ONNX Runtime GenAI worker (:ivar found: the Python it runs in)."""

    found: FoundPython

    @classmethod
    async def start(cls, found: FoundPython) -> OnnxWorker:
        env = dict(os.environ)
        env.update(PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(whole_number_setting(CACHE_SIZE_ENV, 1))
        worker = await cls.spawn(
            [str(found.python), str(WORKER_SCRIPT)],
            kind=KIND,
            runs_dir=werk_home() / "backends" / f"{KIND}-runs",
            env=env,
            start_timeout=120.0,
            max_waiting=lambda: whole_number_setting(MAX_WAITING_ENV, 8),
            waiting_setting=MAX_WAITING_ENV,
        )
        worker.found = found
        return await worker.handshake()
