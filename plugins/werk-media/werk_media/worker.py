"""The host side of the media companion worker (protocol in ``_worker.py``).

One worker process per kind (``media``: the generic Diffusers/Transformers worker;
``qwen-tts``: the Qwen3-TTS worker, in its own environment) per Werk process, started on the
first request for a model of that kind and reused while the
server lives; one request at a time (a lock). It is a :class:`werk.SupervisedProcess` with
``stdio``: frames on its stdin/stdout, its stderr in a log under a private
:class:`werk.WorkDir`. Any failure ends the worker — an error reply, a malformed or foreign
frame, a timeout, a caller that goes away mid-request (its reply would otherwise be read by
the next request) — and the next request starts a cold one; an ``execute`` is never sent
twice.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import anyio

from werk import (
    BackendError,
    CapabilityId,
    InvalidRequest,
    ResourceExhausted,
    RuntimeEnded,
    SupervisedProcess,
    Unavailable,
    Unsupported,
    WerkTimeout,
    WorkDir,
    werk_home,
)

from .environment import MediaPython

__all__ = ["TRANSPORT_VERSION", "MediaWorker", "WorkerGone"]

log = logging.getLogger("werk.media")

TRANSPORT_VERSION = 1
WORKER_SCRIPT = Path(__file__).with_name("_worker.py")
CACHE_SIZE_ENV = "WERK_MEDIA_PIPELINE_CACHE_SIZE"
MAX_WAITING_ENV = "WERK_MEDIA_MAX_WAITING"
DEFAULT_MAX_WAITING = 8
"""Requests that may wait for a busy worker (one runs at a time); one more is ``429``."""
LOGGED_WAIT_SECONDS = 1.0
"""A request that waited longer than this for the worker is logged (at warning level)."""
START_TIMEOUT_SECONDS = 180.0
MAX_FRAME_BYTES = 64 * 1024 * 1024


class WorkerGone(BackendError):
    """The worker failed or exited during a request; the next request starts a new one."""


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


class MediaWorker:
    """A running companion worker."""

    def __init__(
        self, process: SupervisedProcess, workdir: WorkDir, found: MediaPython, kind: str
    ) -> None:
        self.kind = kind
        self.process = process
        self.workdir = workdir
        self.found = found
        self.generation = "g_" + secrets.token_hex(8)
        self.resident: list[dict[str, Any]] = []
        self.versions: dict[str, str] = {}
        self.capacity = 0
        self.features: dict[str, dict[str, str]] = {}
        self._ids = itertools.count(1)
        self._lock = anyio.Lock()
        self._last_execute_seconds = 1.0
        self._ended = False
        self._on_end: list[Callable[[], None]] = []

    @classmethod
    async def start(cls, found: MediaPython, kind: str = "media") -> MediaWorker:
        """Spawn the worker of ``kind`` and wait for its ``health`` answer (imports take a
        while)."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
        env[CACHE_SIZE_ENV] = str(cache_size())
        generation = "g_" + secrets.token_hex(8)
        workdir = WorkDir.create(werk_home() / "backends" / f"{kind}-runs", generation)
        process = SupervisedProcess.spawn(
            [found.python, str(WORKER_SCRIPT)], log_path=workdir.path / "worker.log", env=env,
            cwd=workdir.path, name=f"{kind}-worker", stdio=True,
        )  # fmt: skip
        worker = cls(process, workdir, found, kind)
        worker.generation = generation
        process.on_exit(lambda code: worker._mark_ended())
        process.watch()
        health = await worker.request("health", {}, timeout=START_TIMEOUT_SECONDS)
        worker.versions = dict(health.get("versions") or {})
        capabilities = await worker.request("capabilities", {})
        worker.capacity = int(capabilities["cache_size"])
        worker.features = dict(capabilities.get("features") or {})
        log.info(
            "%s worker %s ready (%s, from %s)",
            kind,
            process.pid, ", ".join(f"{k} {v}" for k, v in worker.versions.items()), found.source,
        )  # fmt: skip
        return worker

    def alive(self) -> bool:
        return not self._ended and self.process.poll() is None

    def on_end(self, callback: Callable[[], None]) -> None:
        self._on_end.append(callback)

    def _mark_ended(self) -> None:
        if self._ended:
            return
        self._ended = True
        for callback in self._on_end:
            callback()

    def _exchange(self, frame: bytes) -> bytes:
        """Blocking: write one frame, read one line (in a worker thread)."""
        stdin: IO[bytes] | None = self.process.popen.stdin
        stdout: IO[bytes] | None = self.process.popen.stdout
        if stdin is None or stdout is None:
            return b""
        try:
            stdin.write(frame)
            stdin.flush()
            return stdout.readline(MAX_FRAME_BYTES)
        except (BrokenPipeError, ValueError, OSError):
            return b""

    async def request(
        self, op: str, args: dict[str, Any], *, timeout: float = 600.0
    ) -> dict[str, Any]:
        """One request; any failure ends the worker (see the module docstring). An
        ``execute`` waits for the one running (first come, first served) when fewer than
        :func:`max_waiting` wait already; otherwise it is refused at once: ``429
        resource_exhausted`` with a ``Retry-After`` of the last execution's duration."""
        waiting = self._lock.statistics().tasks_waiting
        bound = max_waiting() if op == "execute" and self._lock.locked() else None
        if bound is not None and waiting >= bound:
            retry = max(1, round(self._last_execute_seconds))
            raise ResourceExhausted(
                f"the {self.kind} worker is busy and {waiting} request(s) already wait for it "
                f"({MAX_WAITING_ENV}={bound}); retry in about {retry} s",
                retry_after=retry,
            )
        queued = time.monotonic()
        async with self._lock:
            waited = time.monotonic() - queued
            if waited > LOGGED_WAIT_SECONDS:
                log.warning(
                    "%s request (%s) waited %.1f s for the %s worker (one request at a time)",
                    op,
                    self.kind,
                    waited,
                    self.kind,
                )
            started = time.monotonic()
            try:
                return await self._request_locked(op, args, timeout)
            finally:
                if op == "execute":
                    self._last_execute_seconds = time.monotonic() - started

    async def _request_locked(
        self, op: str, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """One request while holding the lock."""
        if not self.alive():  # it ended while this request waited: nothing was sent
            raise RuntimeEnded(
                f"the {self.kind} worker ended before this request reached it",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        request_id = f"r{next(self._ids)}"
        frame = json.dumps({"v": TRANSPORT_VERSION, "id": request_id, "op": op, "args": args})
        try:
            with anyio.fail_after(timeout):
                line = await anyio.to_thread.run_sync(
                    self._exchange, (frame + "\n").encode(), abandon_on_cancel=True
                )
        except TimeoutError:
            await self.stop()
            raise WerkTimeout(
                f"the {self.kind} worker did not answer {op} in {timeout:.0f}s"
            ) from None
        except BaseException:  # cancelled mid-request: its late reply must never be read
            self.process.kill_now()
            self._mark_ended()
            raise
        return await self._reply(op, request_id, line)

    async def _reply(self, op: str, request_id: str, line: bytes) -> dict[str, Any]:
        if not line:
            code = self.process.poll()
            tail = self.process.log_tail(2048).strip().splitlines()[-1:] or ["no output"]
            await self.stop()
            raise WorkerGone(
                f"the {self.kind} worker exited during {op} (status {code}): {tail[0][:200]}"
            )
        try:
            reply = json.loads(line)
            valid = reply.get("v") == TRANSPORT_VERSION and reply.get("id") == request_id
        except (ValueError, AttributeError):
            valid = False
        if not valid:
            await self.stop()
            raise WorkerGone(f"the {self.kind} worker answered {op} with a malformed frame")
        if not reply.get("ok"):
            error = reply.get("error") or {}
            await self.stop()
            message = str(error.get("message", "?"))[:300]
            if error.get("kind") == "invalid":  # the request, not the worker, was at fault
                raise InvalidRequest(message)
            if error.get("kind") == "unsupported":
                raise Unsupported(message)
            raise WorkerGone(f"the {self.kind} worker failed {op}: {message}")
        result = reply.get("result")
        if not isinstance(result, dict):
            await self.stop()
            raise WorkerGone(f"the {self.kind} worker answered {op} without a result")
        if "resident" in result:
            self.resident = list(result["resident"])
        return result

    async def stop(self) -> None:
        """End the worker (its whole group), reap it, remove its directory (idempotent)."""
        self._mark_ended()
        if self.process.poll() is None:
            await self.process.terminate(grace=5.0)
        for stream in (self.process.popen.stdin, self.process.popen.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self.workdir.release()  # idempotent
