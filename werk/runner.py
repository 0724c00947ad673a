"""Runners: a program started for one generation, fed one JSON request, read as JSON lines.

For a backend with no resident process (the seed's ONNX Runtime external runner and MLX rows):
:func:`run_generation` starts ``argv`` (no shell) as a :class:`werk.SupervisedProcess` in a
private :class:`werk.WorkDir` — its own process group, gone with ``werk serve`` — writes the
request to its stdin and closes it, and reads its stdout. **The runner contract**:

* stdin: one JSON object (the backend's request: for text generation, what
  :func:`werk.generation_args` returned plus what the backend adds, e.g. the model's path).
* stdout, one JSON object per line:

  - ``{"delta": TEXT, "ids": [TOKEN, ...]}`` — the next piece of text (``ids`` optional);
  - then ``{"done": true, "finish_reason": "stop"|"length", "usage": {"prompt_tokens": N,
    "completion_tokens": M}}`` (plus ``"prompt_ids"`` when asked for) and exit 0;
  - or ``{"error": TEXT}`` and a non-zero exit; ``{"error": TEXT, "kind": "invalid"}`` is the
    request's fault (``400``; e.g. a prompt longer than the context).

* stderr: its log; the last :data:`STDERR_TAIL` characters go into the error when it fails.

It is a :class:`werk.GenerationEvents`: ``{"text", "ids"}`` events, then ``result``, so
:func:`werk.generation_reply` answers from it. :class:`RunnerModel` is what a runner backend
keeps per model: the command (the model's ``runner`` option, or the backend's own runner), the
model's path, the timeout (``runner_timeout``), and a per-backend bound on runners at once.

Every way out kills the process group: the ``timeout`` for the whole run (``WerkTimeout``), a
caller that leaves early (a client gone), a malformed line or an exit without ``done``
(``BackendError`` with the status and stderr tail).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, ClassVar, Self

import anyio

from .backends import ModelSpec
from .companion import COMPANION_FRAMES_ENV, frames_dir
from .config import werk_home
from .protocol import BackendError, InvalidRequest, Unavailable, WerkTimeout
from .supervise import SupervisedProcess, WorkDir

__all__ = ["STDERR_TAIL", "RunnerModel", "RunnerStream", "run_generation"]

STDERR_TAIL = 2000
"""How much of a failed runner's stderr its error carries (characters, the end)."""
MAX_LINE_BYTES = 16 * 1024 * 1024
ERROR_EXIT_GRACE = 2.0
"""Seconds a runner that wrote an error may take to exit by itself."""


class RunnerStream:
    """One runner's events (see the module docstring).

    :ivar result: the ``done`` line's result (or ``{"refused": TEXT}``), once the events ended.
    :ivar process: the runner process.
    """

    def __init__(self, process: SupervisedProcess, kind: str, deadline: float) -> None:
        self.process = process
        self.result: dict[str, Any] | None = None
        self._kind = kind
        self._deadline = deadline
        self._texts = 0

    def __aiter__(self) -> Self:
        return self

    def _readline(self) -> bytes:
        stdout: IO[bytes] | None = self.process.popen.stdout
        try:
            return stdout.readline(MAX_LINE_BYTES) if stdout is not None else b""
        except (ValueError, OSError):
            return b""

    async def _failed(self, what: str, *, grace: float = 0.0) -> BackendError:
        """The error for a runner that failed; it is ended (after ``grace`` seconds to exit
        by itself, so its own status is reported)."""
        if grace:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await anyio.to_thread.run_sync(self.process.popen.wait, grace)
        self.process.kill_now()
        code = self.process.popen.returncode
        tail = self.process.log_tail(STDERR_TAIL * 4).strip()[-STDERR_TAIL:]
        return BackendError(
            f"the {self._kind} runner {what} (status {code})" + (f": {tail}" if tail else "")
        )

    async def __anext__(self) -> dict[str, Any]:
        if self.result is not None:
            raise StopAsyncIteration
        try:
            with anyio.fail_after(max(self._deadline - time.monotonic(), 0.001)):
                line = await anyio.to_thread.run_sync(self._readline, abandon_on_cancel=True)
        except TimeoutError:
            self.process.kill_now()
            raise WerkTimeout(f"the {self._kind} runner did not finish in time") from None
        if not line:
            raise await self._failed("exited without a result")
        try:
            frame = json.loads(line)
        except ValueError:
            frame = None
        if not isinstance(frame, dict):
            raise await self._failed("wrote a line that is not a JSON object")
        if "delta" in frame:
            self._texts += 1
            return {"text": str(frame["delta"]), "ids": frame.get("ids") or []}
        if frame.get("done") is True:
            self.result = {k: v for k, v in frame.items() if k != "done"}
            raise StopAsyncIteration
        if "error" in frame:
            message = str(frame["error"])[:STDERR_TAIL]
            if frame.get("kind") == "invalid" and self._texts == 0:
                self.result = {"refused": message}  # the request's fault: a 400
                raise StopAsyncIteration
            raise await self._failed(f"failed: {message};", grace=ERROR_EXIT_GRACE)
        raise await self._failed("wrote a line that is neither delta, done nor error")


@contextlib.asynccontextmanager
async def run_generation(
    argv: Sequence[str],
    request: Mapping[str, Any],
    *,
    kind: str,
    runs_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> AsyncIterator[RunnerStream]:
    """Start a runner for one request (see the module docstring); it is ended and its
    directory removed when the block ends.

    :param kind: names it in errors and logs (``onnx-runner``, ``mlx``).
    :param runs_dir: where its private run directory is made (its stderr log is there).
    :param env: its environment (``os.environ`` without ``PYTHONPATH``/``VIRTUAL_ENV`` when
        ``None``); ``WERK_COMPANION_FRAMES`` is added, so a Python runner can use
        ``werk_companion_frames.GeneratedText``.
    :param timeout: seconds for the whole run.
    """
    base = env if env is not None else os.environ
    environment = {k: v for k, v in base.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment[COMPANION_FRAMES_ENV] = str(frames_dir())
    workdir = WorkDir.create(runs_dir, "run_" + secrets.token_hex(8))
    try:
        process = SupervisedProcess.spawn(
            list(argv), log_path=workdir.path / "runner.log", env=environment,
            cwd=workdir.path, name=f"{kind}-runner", stdio=True,
        )  # fmt: skip
    except BaseException:
        workdir.release()
        raise
    try:
        await anyio.to_thread.run_sync(_feed, process, json.dumps(dict(request)).encode())
        yield RunnerStream(process, kind, time.monotonic() + timeout)
    finally:
        with anyio.CancelScope(shield=True):
            if process.poll() is None:
                await process.terminate(grace=1.0)
            for stream in (process.popen.stdin, process.popen.stdout):
                if stream is not None and not stream.closed:
                    stream.close()
            workdir.release()


def _feed(process: SupervisedProcess, request: bytes) -> None:
    """Write the request and close stdin (a runner that already exited: its output says)."""
    stdin = process.popen.stdin
    if stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, OSError):
        stdin.write(request + b"\n")
        stdin.flush()
    with contextlib.suppress(BrokenPipeError, OSError):
        stdin.close()


DEFAULT_RUNNER_TIMEOUT = 600.0


@dataclass(frozen=True)
class RunnerModel:
    """A model served by a runner per request.

    :ivar kind: the backend (names the runner in errors, and its run directories).
    :ivar argv: the command: the model's ``runner`` option — a JSON list of arguments, or a
        command line split the way a shell would (never run by one) — else the backend's.
    :ivar path: the model's folder (the files' common directory), or its one file.
    :ivar timeout: seconds for one run: the model's ``runner_timeout`` option (default 600).
    :ivar concurrency_setting: the variable bounding this backend's runners at once (default
        1; the other requests wait their turn, none is refused).
    """

    kind: str
    argv: tuple[str, ...]
    path: Path
    timeout: float
    concurrency_setting: str

    _limiters: ClassVar[dict[str, anyio.CapacityLimiter]] = {}

    @classmethod
    def of(
        cls,
        spec: ModelSpec,
        *,
        kind: str,
        default: Callable[[], Sequence[str]],
        concurrency_setting: str,
    ) -> RunnerModel:
        """Read ``spec``'s options (``default()`` gives the backend's own command).

        :raises werk.InvalidRequest: a ``runner`` or ``runner_timeout`` option that is not one.
        """
        timeout = spec.options.get("runner_timeout", DEFAULT_RUNNER_TIMEOUT)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidRequest(f"model {spec.id!r}: option 'runner_timeout' must be seconds > 0")
        configured = spec.options.get("runner")
        if configured is None:
            argv = list(default())
        elif isinstance(configured, str):
            argv = shlex.split(configured)
        elif isinstance(configured, list) and all(isinstance(a, str) for a in configured):
            argv = list(configured)
        else:
            argv = []
        if not argv:
            raise InvalidRequest(
                f"model {spec.id!r}: option 'runner' must be a command line or a JSON list of "
                "arguments"
            )
        files = spec.files
        path = files[0] if len(files) == 1 else Path(os.path.commonpath([str(f) for f in files]))
        return cls(kind, tuple(argv), path, float(timeout), concurrency_setting)

    def _limiter(self) -> anyio.CapacityLimiter:
        limiter = self._limiters.get(self.kind)
        if limiter is None:
            raw = os.environ.get(self.concurrency_setting, "1")
            if not raw.isdigit() or int(raw) < 1:
                raise Unavailable(f"{self.concurrency_setting}={raw!r} is not a whole number >= 1")
            limiter = self._limiters[self.kind] = anyio.CapacityLimiter(int(raw))
        return limiter

    @contextlib.asynccontextmanager
    async def run(self, args: Mapping[str, Any]) -> AsyncIterator[RunnerStream]:
        """One run for ``args`` (the model's path added as ``model``), after waiting for a
        free place among this backend's runners."""
        async with self._limiter():
            generation = run_generation(
                self.argv,
                {**args, "model": str(self.path)},
                kind=self.kind,
                runs_dir=werk_home() / "backends" / f"{self.kind}-runs",
                timeout=self.timeout,
            )
            async with generation as stream:
                yield stream
