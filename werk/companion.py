"""Companion workers: a backend's own Python process, spoken to over stdio, one request at a time.

A backend whose libraries live in another environment (torch, Diffusers, Transformers, ONNX
Runtime…) runs them in a **companion worker**: a :class:`werk.SupervisedProcess` with
``stdio``, started by :meth:`CompanionWorker.spawn` in a private :class:`werk.WorkDir`, its
stderr in that directory's log. The worker script serves the protocol of
``werk/_companion/werk_companion_frames.py`` (standard library only; the worker finds it through
``WERK_COMPANION_FRAMES``, which :meth:`~CompanionWorker.spawn` sets): versioned JSON-lines
frames with request ids, ``health`` first, then whatever operations the backend defines
(media's: ``capabilities``, ``probe-model``, ``estimate``, ``execute``, ``unload``).

Rules every companion worker gets from here:

* **One request at a time.** Requests wait in line (first come, first served); an ``execute``
  (streamed or not) that would make more than ``max_waiting()`` requests wait is refused at
  once (``429 resource_exhausted`` with a ``Retry-After`` of the last execution's duration).
* **Any failure ends the worker** — an error reply, a malformed or foreign frame, a timeout, a
  caller that goes away mid-request (its reply would otherwise be read by the next request) —
  and the next request starts a cold one; an ``execute`` is never sent twice.
* **Typed errors.** An ``invalid`` error reply is ``400``, ``unsupported`` is ``501``, anything
  else (and a worker that exits) is :class:`WorkerGone` (``502 backend_error``); a timeout is
  ``504``. The worker's own text is cut to 300 characters.
* **Streams.** :meth:`CompanionWorker.streaming` reads a handler's events as they come
  (a text generation's deltas) and then its result; it holds the worker for the whole
  stream. A caller that leaves early — also one cancelled while it waits for the next event
  (a client that went away) — makes the host send ``cancel`` and read up to the worker's reply,
  so the worker stays warm (a worker that does not reply within
  :data:`CANCEL_GRACE_SECONDS` is ended).
* **Residency.** A result carrying ``resident`` (the worker's loaded entries) updates
  :attr:`CompanionWorker.resident`, for the backend's capability rows and memory accounting.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Self, TypeVar

import anyio

from .protocol import (
    BackendError,
    CapabilityId,
    InvalidRequest,
    ResourceExhausted,
    RuntimeEnded,
    Unsupported,
    WerkError,
    WerkTimeout,
)
from .supervise import SupervisedProcess, WorkDir

__all__ = [
    "COMPANION_FRAMES_ENV",
    "TRANSPORT_VERSION",
    "CompanionStream",
    "CompanionWorker",
    "WorkerGone",
    "frames_dir",
]

log = logging.getLogger("werk.companion")

TRANSPORT_VERSION = 1
COMPANION_FRAMES_ENV = "WERK_COMPANION_FRAMES"
"""The variable naming the directory of ``werk_companion_frames.py`` for the worker."""
LOGGED_WAIT_SECONDS = 1.0
"""A request that waited longer than this for the worker is logged (at warning level)."""
MAX_FRAME_BYTES = 64 * 1024 * 1024
CANCEL_GRACE_SECONDS = 10.0
"""How long a cancelled stream's worker may take to reply before it is ended."""
BOUNDED_OPS = frozenset({"execute"})
"""Operations refused with ``429`` when too many wait (an ``execute``, streamed or not)."""
T = TypeVar("T")


class WorkerGone(BackendError):
    """The worker failed or exited during a request; the next request starts a new one."""


def _frame(line: bytes, request_id: str) -> dict[str, Any] | None:
    """A frame of this transport for ``request_id``; ``None`` when it is anything else."""
    try:
        frame = json.loads(line)
    except ValueError:
        return None
    if not isinstance(frame, dict):
        return None
    if frame.get("v") != TRANSPORT_VERSION or frame.get("id") != request_id:
        return None
    return frame


def frames_dir() -> Path:
    """The directory holding ``werk_companion_frames.py`` (the worker side of the protocol)."""
    return Path(__file__).with_name("_companion")


class CompanionWorker:
    """A running companion worker (see the module docstring).

    :ivar kind: what it is (``media``, ``qwen-tts``…): names it in messages and its run
        directory.
    :ivar generation: ``g_`` + 16 hex digits, unique per worker process.
    :ivar health: the ``health`` result it started with.
    :ivar versions: its libraries' versions (``health``'s ``versions``).
    :ivar capabilities: its ``capabilities`` answer (after :meth:`handshake`).
    :ivar capacity: the entries its LRU keeps (``capabilities``' ``cache_size``).
    :ivar resident: the last ``resident`` list a result carried.
    """

    def __init__(
        self,
        process: SupervisedProcess,
        workdir: WorkDir,
        kind: str,
        generation: str,
        *,
        max_waiting: Callable[[], int] = lambda: 8,
        waiting_setting: str = "",
    ) -> None:
        self.kind = kind
        self.process = process
        self.workdir = workdir
        self.generation = generation
        self.health: dict[str, Any] = {}
        self.versions: dict[str, str] = {}
        self.capabilities: dict[str, Any] = {}
        self.capacity = 0
        self.resident: list[dict[str, Any]] = []
        self._max_waiting = max_waiting
        self._waiting_setting = waiting_setting
        self._ids = itertools.count(1)
        self._lock = anyio.Lock()
        self._last_execute_seconds = 1.0
        self._ended = False
        self._on_end: list[Callable[[], None]] = []
        self._pending: concurrent.futures.Future[bytes] | None = None

    @classmethod
    async def spawn(
        cls,
        argv: Sequence[str],
        *,
        kind: str,
        runs_dir: Path,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 180.0,
        max_waiting: Callable[[], int] = lambda: 8,
        waiting_setting: str = "",
    ) -> Self:
        """Start ``argv`` (the worker's Python and script) in a new run directory under
        ``runs_dir`` and wait for its ``health`` answer (imports take a while).

        :param env: its environment (``os.environ`` without ``PYTHONPATH``/``VIRTUAL_ENV``
            when ``None``); :data:`COMPANION_FRAMES_ENV` is added.
        :param max_waiting: how many requests may wait for it (read at each request).
        :param waiting_setting: the setting that changes that bound, named in the refusal.
        :raises werk.WerkError: it did not start or answer ``health`` (it is stopped).
        """
        base = env if env is not None else os.environ
        environment = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        environment[COMPANION_FRAMES_ENV] = str(frames_dir())
        generation = "g_" + secrets.token_hex(8)
        workdir = WorkDir.create(runs_dir, generation)
        process = SupervisedProcess.spawn(
            list(argv), log_path=workdir.path / "worker.log", env=environment,
            cwd=workdir.path, name=f"{kind}-worker", stdio=True,
        )  # fmt: skip
        worker = cls(
            process,
            workdir,
            kind,
            generation,
            max_waiting=max_waiting,
            waiting_setting=waiting_setting,
        )
        process.on_exit(lambda code: worker._mark_ended())
        process.watch()
        worker.health = await worker.request("health", {}, timeout=start_timeout)
        worker.versions = {str(k): str(v) for k, v in (worker.health.get("versions") or {}).items()}
        return worker

    async def handshake(self) -> Self:
        """Ask the worker's ``capabilities`` (:attr:`capabilities`, :attr:`capacity`); a worker
        that does not answer is stopped and the error raised."""
        try:
            self.capabilities = await self.request("capabilities", {})
        except BaseException:
            await self.stop()
            raise
        self.capacity = int(self.capabilities.get("cache_size") or 0)
        log.info(
            "%s worker %s ready (%s)",
            self.kind,
            self.process.pid,
            ", ".join(f"{k} {v}" for k, v in self.versions.items()),
        )
        return self

    def alive(self) -> bool:
        return not self._ended and self.process.poll() is None

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the worker ends (stopped, failed or exited)."""
        self._on_end.append(callback)

    def _mark_ended(self) -> None:
        if self._ended:
            return
        self._ended = True
        for callback in self._on_end:
            callback()

    def _send(self, frame: bytes) -> bool:
        """Blocking: write one frame; whether it was written."""
        stdin: IO[bytes] | None = self.process.popen.stdin
        if stdin is None:
            return False
        try:
            stdin.write(frame)
            stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return False
        return True

    def _readline(self) -> bytes:
        """Blocking: one line from the worker (``b""`` when it is gone)."""
        stdout: IO[bytes] | None = self.process.popen.stdout
        if stdout is None:
            return b""
        try:
            return stdout.readline(MAX_FRAME_BYTES)
        except (ValueError, OSError):
            return b""

    async def _read_frame(self) -> bytes:
        """The worker's next line. A caller cancelled while it waits leaves the read pending
        (its thread still takes the line), and the next call gets that line: no frame is
        lost or read twice."""
        pending = self._pending
        if pending is None:  # its own thread: it reads even when this caller is cancelled
            pending = self._pending = concurrent.futures.Future()  # before awaiting it
            threading.Thread(
                target=lambda: pending.set_result(self._readline()),
                name=f"{self.kind}-worker-reader",
                daemon=True,
            ).start()
        line = await anyio.to_thread.run_sync(pending.result, abandon_on_cancel=True)
        self._pending = None
        return line

    def _exchange(self, frame: bytes) -> bytes:
        """Blocking: write one frame, read one line (in a worker thread)."""
        return self._readline() if self._send(frame) else b""

    def _refuse_when_full(self, op: str) -> None:
        waiting = self._lock.statistics().tasks_waiting
        bound = self._max_waiting() if op in BOUNDED_OPS and self._lock.locked() else None
        if bound is not None and waiting >= bound:
            retry = max(1, round(self._last_execute_seconds))
            setting = f" ({self._waiting_setting}={bound})" if self._waiting_setting else ""
            raise ResourceExhausted(
                f"the {self.kind} worker is busy and {waiting} request(s) already wait for it"
                f"{setting}; retry in about {retry} s",
                retry_after=retry,
            )

    @contextlib.asynccontextmanager
    async def _turn(self, op: str) -> AsyncIterator[None]:
        """Wait for the worker (one request at a time); time the bounded operations."""
        self._refuse_when_full(op)
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
                yield
            finally:
                if op in BOUNDED_OPS:
                    self._last_execute_seconds = time.monotonic() - started

    async def request(
        self, op: str, args: dict[str, Any], *, timeout: float = 600.0
    ) -> dict[str, Any]:
        """One request; see the module docstring for waiting, failures and errors."""
        async with self._turn(op):
            return await self._request_locked(op, args, timeout)

    @contextlib.asynccontextmanager
    async def streaming(
        self, op: str, args: dict[str, Any], *, timeout: float = 600.0
    ) -> AsyncIterator[CompanionStream]:
        """A streamed request: ``async for event in stream`` gives the worker's events, then
        ``stream.result`` is its result. Leaving the block before the end (the caller went
        away) asks the worker to cancel and reads up to its reply, so it stays warm; a worker
        that does not answer that in :data:`CANCEL_GRACE_SECONDS` is ended. ``timeout``
        bounds the wait for each frame."""
        async with self._turn(op):
            stream = CompanionStream(self, op, await self._open(op, args, timeout), timeout)
            try:
                yield stream
            finally:
                if not stream.finished:
                    with anyio.CancelScope(shield=True):
                        await stream.cancel()

    async def _open(self, op: str, args: dict[str, Any], timeout: float) -> str:
        """Send a request (the worker is this caller's); its id."""
        self._check_alive()
        request_id = f"r{next(self._ids)}"
        frame = json.dumps({"v": TRANSPORT_VERSION, "id": request_id, "op": op, "args": args})
        sent = await self._guarded(op, timeout, self._send, (frame + "\n").encode())
        if not sent:
            await self._reply(op, request_id, b"")  # raises WorkerGone with its status
        return request_id

    async def _guarded(self, op: str, timeout: float, call: Callable[..., T], *args: Any) -> T:
        """``call(*args)`` in a thread: a timeout ends the worker (``WerkTimeout``); so does
        a caller cancelled meanwhile (a late frame must never reach the next request)."""
        try:
            with anyio.fail_after(timeout):
                return await anyio.to_thread.run_sync(call, *args, abandon_on_cancel=True)
        except TimeoutError:
            await self.stop()
            raise WerkTimeout(
                f"the {self.kind} worker did not answer {op} in {timeout:.0f}s"
            ) from None
        except BaseException:
            self.process.kill_now()
            self._mark_ended()
            raise

    def _check_alive(self) -> None:
        if not self.alive():  # it ended while this request waited: nothing was sent
            raise RuntimeEnded(
                f"the {self.kind} worker ended before this request reached it",
                capability=CapabilityId.MODEL_RESIDENCY,
            )

    async def _request_locked(
        self, op: str, args: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        self._check_alive()
        request_id = f"r{next(self._ids)}"
        frame = json.dumps({"v": TRANSPORT_VERSION, "id": request_id, "op": op, "args": args})
        line = await self._guarded(op, timeout, self._exchange, (frame + "\n").encode())
        return await self._reply(op, request_id, line)

    async def _exit_code(self, wait: float = 1.0) -> int | None:
        """The exit status of a worker whose output just ended: the kernel closes its pipes a
        moment before the process is reapable, so wait up to ``wait`` seconds for it."""
        deadline = anyio.current_time() + wait
        code = self.process.poll()
        while code is None and anyio.current_time() < deadline:
            await anyio.sleep(0.01)
            code = self.process.poll()
        return code

    async def _reply(self, op: str, request_id: str, line: bytes) -> dict[str, Any]:
        if not line:
            code = await self._exit_code()
            tail = self.process.log_tail(2048).strip().splitlines()[-1:] or ["no output"]
            await self.stop()
            raise WorkerGone(
                f"the {self.kind} worker exited during {op} (status {code}): {tail[0][:200]}"
            )
        reply = _frame(line, request_id)
        if reply is None or "event" in reply:
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


class CompanionStream:
    """The events of one streamed request (:meth:`CompanionWorker.streaming`).

    :ivar result: the worker's result, once the events ended (``None`` before).
    :ivar finished: whether the worker's reply was read.
    """

    def __init__(self, worker: CompanionWorker, op: str, request_id: str, timeout: float) -> None:
        self._worker = worker
        self._op = op
        self._id = request_id
        self._timeout = timeout
        self.result: dict[str, Any] | None = None
        self.finished = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.finished:
            raise StopAsyncIteration
        worker = self._worker
        try:
            with anyio.fail_after(self._timeout):
                line = await worker._read_frame()
        except TimeoutError:
            self.finished = True
            await worker.stop()
            raise WerkTimeout(
                f"the {worker.kind} worker sent nothing for {self._op} in {self._timeout:.0f}s"
            ) from None
        frame = _frame(line, self._id)
        if frame is not None and isinstance(frame.get("event"), dict):
            return dict(frame["event"])
        self.finished = True  # the reply (or a fault, which ends the worker and raises)
        self.result = await worker._reply(self._op, self._id, line)
        raise StopAsyncIteration

    async def cancel(self) -> None:
        """Ask the worker to stop, read up to its reply; end it when that fails."""
        worker = self._worker
        cancel = json.dumps({"v": TRANSPORT_VERSION, "id": self._id, "op": "cancel"})
        try:
            with anyio.fail_after(CANCEL_GRACE_SECONDS):
                sent = await anyio.to_thread.run_sync(
                    worker._send, (cancel + "\n").encode(), abandon_on_cancel=True
                )
                while sent and not self.finished:
                    line = await worker._read_frame()
                    frame = _frame(line, self._id)
                    if frame is None or not isinstance(frame.get("event"), dict):
                        self.finished = True
                        self.result = await worker._reply(self._op, self._id, line)
        except (TimeoutError, WerkError) as exc:
            log.warning("the %s worker did not cancel cleanly (%s); ending it", worker.kind, exc)
        if not self.finished:
            await worker.stop()
            self.finished = True
