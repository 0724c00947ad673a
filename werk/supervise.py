"""Supervised child processes: what every backend that runs a server process needs, once.

A backend plugin that starts ``llama-server``, ``vllm serve``, a media worker or any other
child process uses these pieces instead of writing its own (docs/plugins.md, "Supervised
processes"):

* :class:`WorkDir` — a private (0700) directory for one child's lifetime, held by an ``flock``
  on its ``lock`` file; :func:`sweep_stale_workdirs` removes the ones a killed Werk left behind.
* :class:`SupervisedProcess` — :meth:`~SupervisedProcess.spawn` starts the program in its own
  session (process group), with stdout and stderr in a log file and **parent-death
  signalling**: on Linux the kernel SIGKILLs the child when the thread that spawned it dies,
  Werk's SIGKILL included. Exit detection without polling (a ``pidfd`` watched by the event
  loop), reaping, :meth:`~SupervisedProcess.log_tail` for error messages, and
  :meth:`~SupervisedProcess.terminate`, which stops the **whole process group** (SIGTERM, a
  grace period, then SIGKILL), so helper processes of the child (vLLM's engine) go too. Helpers
  have no parent-death signal of their own: for a program that starts some, spawn with
  ``guard_group=True`` and the shim stays as the group's guardian, SIGKILLing the whole group
  when Werk dies.
* :func:`wait_until_ready` — readiness polling with a deadline that notices an early exit;
  :func:`child_api_key` for the child's private key, and (from :mod:`werk.ports`, re-exported
  here) :func:`free_port` and :func:`listens_on` for its loopback port.

Restarting is the host's job: the runtime manager starts a new runtime (with backoff) when a
plugin marks the old one dead, e.g. from an :meth:`~SupervisedProcess.on_exit` callback.

**Parent-death signalling is fork-safe.** ``preexec_fn`` runs Python between ``fork`` and
``exec`` and can deadlock in a threaded server, so the child is started through a launcher that
calls ``prctl(PR_SET_PDEATHSIG, …)``, checks that its parent is still the spawning process, and
``exec``\\ s the real program (the setting survives ``exec``): util-linux's ``setpriv
--pdeathsig KILL`` followed by ``sh`` for the check where ``setpriv`` is installed (3 ms), else a
tiny Python shim (``python -I -S -c …``, 15 ms), which is also what runs a ``guard_group``
program as its child.
Linux delivers the signal when the spawning *thread* exits: spawn from the long-lived
event-loop thread, never from a worker thread (anyio retires idle worker threads after a few
seconds, which would kill the child).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import anyio

from .ports import free_port, listens_on
from .protocol import CapabilityId, WerkTimeout

__all__ = [
    "ProcessExited",
    "SupervisedProcess",
    "WorkDir",
    "child_api_key",
    "free_port",
    "listens_on",
    "stop_group",
    "sweep_stale_workdirs",
    "wait_until_ready",
]

log = logging.getLogger("werk.supervise")

TERM_GRACE_SECONDS = 5.0
LOG_TAIL_BYTES = 16 * 1024
READY_POLL_MAX_SECONDS = 0.1
READY_POLL_FIRST_SECONDS = 0.01
READY_POLL_FAST_PERIOD = 1.0

# argv: [python, -I, -S, -c, SHIM, parent_pid, guard, program, args...]; exits 127 when the
# program cannot be executed. guard "0": prctl, then exec the program (it *is* the child).
# guard "1": the shim stays as the group's guardian: it runs the program as its own child, and
# when Werk dies (parent-death signal SIGUSR2) SIGKILLs the whole process group, helpers the
# program started included; when the program exits it exits with the program's status
# (128 + N for a signal N), and Werk then stops the rest of the group. SIGTERM and SIGINT are
# blocked across the fork, so one that arrives while the child is still the shim is delivered
# to it with the default action when it unblocks them, and one that reached the guardian
# before the fork is passed on to the child (before, both were ignored and a stop request
# could be lost); the guardian itself ignores them and waits for the program.
_PDEATHSIG_SHIM = (
    "import ctypes,os,signal,sys\n"
    "guard=sys.argv[2]=='1'\n"
    "if sys.platform.startswith('linux'):\n"
    " sig=signal.SIGUSR2 if guard else signal.SIGKILL\n"
    " if guard: signal.signal(sig,lambda n,f: os.killpg(0,signal.SIGKILL))\n"
    " ctypes.CDLL(None,use_errno=True).prctl(1,int(sig),0,0,0)\n"
    " os.getppid()==int(sys.argv[1]) or os._exit(1)\n"
    "def run():\n"
    " try: os.execv(sys.argv[3],sys.argv[3:])\n"
    " except OSError as e:\n"
    "  print('werk: cannot execute',sys.argv[3],e,file=sys.stderr); os._exit(127)\n"
    "if not guard: run()\n"
    "stop={signal.SIGTERM,signal.SIGINT}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK,stop)\n"
    "pid=os.fork()\n"
    "if pid==0:\n"
    " signal.signal(signal.SIGTERM,signal.SIG_DFL); signal.signal(signal.SIGINT,signal.SIG_DFL)\n"
    " signal.signal(signal.SIGUSR2,signal.SIG_DFL)\n"
    " signal.pthread_sigmask(signal.SIG_UNBLOCK,stop); run()\n"
    "for n in signal.sigpending()&stop: os.kill(pid,n)\n"
    "signal.signal(signal.SIGTERM,signal.SIG_IGN); signal.signal(signal.SIGINT,signal.SIG_IGN)\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK,stop)\n"
    "while True:\n"
    " try: _,status=os.waitpid(pid,0); break\n"
    " except InterruptedError: continue\n"
    "code=os.waitstatus_to_exitcode(status)\n"
    "os._exit(code if code>=0 else 128-code)\n"
)


def child_api_key() -> str:
    """A fresh random API key for one child process, safe to pass as a command-line value.

    ``secrets.token_urlsafe`` alone may begin with ``-``, and an ``argparse`` child (vLLM, a
    media or oMLX worker) then reads ``--api-key -Xyz…`` as a missing value followed by an
    unknown flag and exits (one start in 64 failed that way). The key here always starts with
    ``wk_`` and carries 256 random bits."""
    return "wk_" + secrets.token_urlsafe(32)


# -- private working directories ---------------------------------------------------------------


def _private_dir(path: Path, *, exist_ok: bool) -> None:
    path.mkdir(mode=0o700, parents=exist_ok, exist_ok=exist_ok)
    os.chmod(path, 0o700)


class WorkDir:
    """A private directory that belongs to one child's lifetime.

    Its ``lock`` file is ``flock``-ed for as long as this object lives, so a directory whose lock
    nobody holds belongs to a Werk that died (:func:`sweep_stale_workdirs`).
    """

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, root: Path, name: str, *, subdirs: Sequence[str] = ()) -> WorkDir:
        """Create ``root/name`` (0700) with ``subdirs`` (0700) and a held ``lock``, after
        removing stale siblings that share ``name``'s prefix (up to the first ``_``)."""
        _private_dir(root, exist_ok=True)
        prefix = name.split("_", 1)[0] + "_" if "_" in name else name
        sweep_stale_workdirs(root, prefix=prefix)
        path = root / name
        _private_dir(path, exist_ok=False)
        for sub in subdirs:
            _private_dir(path / sub, exist_ok=False)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(path / "lock", flags, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, fd)

    def release(self) -> None:
        """Delete the directory and release its lock (after the child is reaped). Idempotent."""
        shutil.rmtree(self.path, ignore_errors=True)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = None


def sweep_stale_workdirs(root: Path, *, prefix: str = "g_") -> list[str]:
    """Remove the directories under ``root`` named ``prefix…`` whose ``lock`` nobody holds."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        try:
            fd = os.open(entry / "lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if time.time() - entry.stat().st_mtime < 60:
                continue  # being created right now
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live Werk holds it
        else:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry.name)
        finally:
            os.close(fd)
    return removed


# -- the process ---------------------------------------------------------------------------------


class ProcessExited(Exception):
    """The child exited while the caller waited for it (:func:`wait_until_ready`)."""

    def __init__(self, code: int) -> None:
        super().__init__(f"the process exited with {code}")
        self.code = code


_SH = "/bin/sh"
_SH_EXEC = 'test "$PPID" = "$1" || exit 1; shift; exec "$@"'
"""The ``sh`` half of the setpriv launcher: the same parent check as the Python shim's."""


@functools.lru_cache(maxsize=1)
def setpriv_executable() -> str | None:
    """util-linux's ``setpriv`` when it can set a parent-death signal (2.33 and later)."""
    found = shutil.which("setpriv")
    if found is None or not os.path.exists(_SH):
        return None
    try:
        usage = subprocess.run([found, "--help"], capture_output=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return found if b"--pdeathsig" in usage else None


def _launcher(program: str, guard_group: bool) -> list[str]:
    """What runs before ``program`` to give it its parent-death signal.

    Without ``guard_group``, on Linux with ``setpriv`` and an executable file: ``setpriv
    --pdeathsig KILL`` (a small C program) execs ``sh``, which checks that its parent is still
    the spawning process and execs the program: about 3 ms, against 15 ms for the Python shim's
    interpreter start-up, which is on the way to a model's first token at every start. (``sh``
    runs an executable text file without a ``#!`` line as a script, as ``execvp`` does; the
    Python shim refuses it.) Otherwise the Python shim, which also reports a program it cannot
    execute in the log and is the guardian of a guarded group.
    """
    setpriv = None if guard_group else setpriv_executable()
    if setpriv is not None and os.path.isfile(program) and os.access(program, os.X_OK):
        return [
            setpriv,
            "--pdeathsig",
            "KILL",
            "--",
            _SH,
            "-c",
            _SH_EXEC,
            "werk-exec",
            str(os.getpid()),
        ]
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _PDEATHSIG_SHIM,
        str(os.getpid()),
        "1" if guard_group else "0",
    ]


class SupervisedProcess:
    """One child process in its own process group, with exit detection and a log file."""

    def __init__(
        self, popen: subprocess.Popen[bytes], *, log_path: Path | None = None, name: str = ""
    ) -> None:
        self.popen = popen
        self.log_path = log_path
        self.name = name or Path(str(popen.args[0] if isinstance(popen.args, list) else "")).name
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._on_exit: list[Callable[[int], None]] = []
        self._exit_reported = False

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str | Path],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        name: str = "",
        guard_group: bool = False,
        stdio: bool = False,
    ) -> SupervisedProcess:
        """Start ``argv`` (call from the event-loop thread: see the module docstring).

        stdin is ``/dev/null``; stdout and stderr go to ``log_path`` (created 0600, truncated).

        :param stdio: for a worker that speaks a protocol on its standard streams: stdin and
            stdout are pipes (``popen.stdin``, ``popen.stdout``, unbuffered binary); stderr
            alone goes to ``log_path``.

        :param guard_group: for a program that starts helper processes of its own (vLLM's
            engine): a guardian (the exec shim, staying alive as the group leader) runs the
            program as its child and SIGKILLs the whole group when Werk dies, so no helper
            outlives even a SIGKILLed Werk. The process's ``pid`` is then the guardian's (check
            readiness over the program's socket, not by pid), and a signal ``N`` that ended the
            program shows as exit status ``128 + N``.
        """
        program = str(argv[0])
        if os.sep not in program:
            found = shutil.which(program, path=(env or os.environ).get("PATH"))
            program = found or program
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            popen = subprocess.Popen(
                [*_launcher(program, guard_group), program, *map(str, argv[1:])],
                stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
                stdout=subprocess.PIPE if stdio else log_fd,
                stderr=log_fd if stdio else subprocess.STDOUT,
                bufsize=0,
                env=dict(env) if env is not None else None,
                cwd=cwd,
                start_new_session=True,  # its own process group; Ctrl+C reaches Werk only
            )
        finally:
            os.close(log_fd)
        return cls(popen, log_path=log_path, name=name or Path(program).name)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        """The exit code once the child has exited (and reap it), else ``None``.

        Before the leader is reaped (while its zombie still holds the process group id, so the
        id cannot have been reused) the rest of its group is SIGKILLed: no helper outlives it.
        """
        if self.popen.returncode is None and self._exited_unreaped():
            self.signal_group(signal.SIGKILL)
        code = self.popen.poll()
        if code is not None:
            self._report_exit(code)
        return code

    def _exited_unreaped(self) -> bool:
        waitid = getattr(os, "waitid", None)
        if waitid is None:  # not Linux: the group is signalled by terminate/kill_now only
            return False
        try:
            info = waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is not None

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` once when the child exits (at once if it has)."""
        self._on_exit.append(callback)
        if self._exit_reported and self.popen.returncode is not None:
            callback(self.popen.returncode)

    def _report_exit(self, code: int) -> None:
        if self._exit_reported:
            return
        self._exit_reported = True
        self.unwatch()
        for callback in self._on_exit:
            try:
                callback(code)
            except Exception:
                log.exception("exit callback of %s failed", self.name)

    def watch(self) -> bool:
        """Watch the child's pidfd on the running asyncio loop, so its exit is noticed (and
        reaped, and reported to :meth:`on_exit` callbacks) at once; ``False`` if unavailable
        (then :meth:`poll` at each use does the same)."""
        if self._pidfd is not None:
            return True
        pidfd_open = getattr(os, "pidfd_open", None)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if pidfd_open is None:
            return False
        try:
            fd = pidfd_open(self.pid)
        except OSError:
            self.poll()
            return False
        try:
            loop.add_reader(fd, self.poll)
        except (NotImplementedError, OSError):
            os.close(fd)
            return False
        self._pidfd, self._loop, self._loop_thread = fd, loop, threading.get_ident()
        self.poll()  # it may have exited before the watch began
        return True

    def unwatch(self) -> None:
        """Stop watching (thread-safe: capability discovery may poll from a worker thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._unwatch_now)
                return
        self._unwatch_now()

    def _unwatch_now(self) -> None:
        fd, loop = self._pidfd, self._loop
        self._pidfd = self._loop = None
        if fd is None:
            return
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.remove_reader(fd)
        os.close(fd)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the child's process group (its helpers too)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def kill_now(self) -> None:
        """SIGKILL the process group and reap, synchronously (startup failures, cancellation)."""
        if self.popen.returncode is None:
            self.signal_group(signal.SIGKILL)  # leader alive or a zombie: the group id is held
            self.popen.wait()
        self.poll()

    async def terminate(self, grace: float = TERM_GRACE_SECONDS) -> int:
        """SIGTERM the process group, wait up to ``grace`` seconds, then SIGKILL the group;
        always reaps. Idempotent."""
        if self.poll() is None:
            self.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            delay = 0.01
            while self.poll() is None and time.monotonic() < deadline:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)
            if self.poll() is None:
                log.warning("%s %s ignored SIGTERM; killing it", self.name, self.pid)
                self.kill_now()
        code = self.popen.returncode
        assert code is not None
        return code

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        """The last ``limit`` bytes of the child's log (``""`` without one)."""
        if self.log_path is None:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""


def stop_group(popen: subprocess.Popen[bytes], grace: float = TERM_GRACE_SECONDS) -> int:
    """Stop a process started with ``start_new_session=True`` (it leads its own group) the way
    Werk stops its children, synchronously: SIGTERM the group, wait up to ``grace`` seconds for
    the leader, then SIGKILL the group — helpers that outlived the leader too — and reap. For
    scripts and tests that use :mod:`subprocess` directly (the benchmarks); idempotent.

    The group is signalled only while the leader is alive or an unreaped zombie, so its id
    cannot have been reused by an unrelated process.
    """
    if popen.poll() is not None:
        return popen.returncode
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            break  # exited, not reaped yet: the group id is still held
        time.sleep(0.02)
    else:
        log.warning("process %s ignored SIGTERM for %.0f s; killing its group", popen.pid, grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    return popen.wait()


async def wait_until_ready(
    process: SupervisedProcess,
    ready: Callable[[], Awaitable[bool]],
    *,
    timeout: float,
    what: str = "the process",
) -> None:
    """Call ``ready()`` until it returns ``True``: every 10 ms during the first second (a small
    model is ready in well under that, and every poll interval is added to the time to the first
    token), then with pauses growing to 0.1 s.

    :raises ProcessExited: the child exited first.
    :raises werk.WerkTimeout: ``timeout`` seconds passed (the child is left running: the
        caller decides whether to stop it).
    """
    start = time.monotonic()
    deadline = start + timeout
    delay = READY_POLL_FIRST_SECONDS
    while True:
        code = process.poll()
        if code is not None:
            raise ProcessExited(code)
        if await ready():
            return
        if time.monotonic() >= deadline:
            raise WerkTimeout(
                f"{what} did not become ready within {timeout:.0f}s",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        await anyio.sleep(delay)
        if time.monotonic() - start >= READY_POLL_FAST_PERIOD:
            delay = min(delay * 1.5, READY_POLL_MAX_SECONDS)
