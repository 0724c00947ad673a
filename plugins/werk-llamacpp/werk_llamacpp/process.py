"""One managed ``llama-server`` child: spawn, readiness, crash detection, stop.

Each start spawns exactly one child, bound to ``127.0.0.1`` on a free port, with a random
per-child API key, and a private generation directory (0700)::

    WERK_HOME/backends/llamacpp/g_<hex>/   lock, server.log (stdout+stderr), slots/ (0700)

The generation directory belongs to the child's lifetime: :meth:`Child.remove_dir` deletes it
on stop (state files the host has not moved into its catalog are the child's private temporary
files). A directory left behind by a Werk that was SIGKILLed is recognised by its unlocked
``lock`` file (an ``flock`` held for the child's lifetime) and removed by the next start.

**Children never outlive Werk silently (Linux).** The child is spawned with
``PR_SET_PDEATHSIG = SIGKILL`` (``prctl`` through ctypes in ``preexec_fn``), so the kernel kills
it when its parent dies, including by SIGKILL. Linux delivers the signal when the *thread* that
forked the child exits, not the process: spawn only from the long-lived event-loop thread (what
:func:`spawn_child` is called from in ``werk serve``), never from a worker thread (anyio retires
idle worker threads after a few seconds, which would kill the child). The child runs in its own
session so a terminal's Ctrl+C reaches Werk only; Werk then stops the child itself.

**Crash detection.** A ``pidfd`` of the child is watched by the event loop (no polling); when
the child exits it is reaped at once and the registered callback marks the runtime dead.
Without pidfd support :meth:`Child.poll` at each operation does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import psutil

from werk import (
    BackendError,
    CapabilityId,
    InvalidRequest,
    ModelSpec,
    Runtime,
    Unavailable,
    WerkTimeout,
    werk_home,
)

from .args import (
    STATE_SLOT_COUNT,
    BuiltArgs,
    LaunchOptions,
    build_args,
    parse_options,
    state_blockers,
)
from .executable import locate_llama_server
from .handle import LlamaHandle, ProbeResult, ProbeStatus
from .inspect import Inspection, child_environment, inspect_executable, verify_unchanged

__all__ = [
    "Child",
    "ManagedHandle",
    "SlotPicker",
    "check_alive",
    "free_port",
    "generation_root",
    "new_generation",
    "spawn_child",
    "start_runtime",
    "startup_failure",
    "stop_runtime",
    "sweep_stale_generations",
]

log = logging.getLogger("werk.llamacpp")

PR_SET_PDEATHSIG = 1
TERM_GRACE_SECONDS = 5.0
LOG_TAIL_BYTES = 16 * 1024

_libc: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)


def generation_root() -> Path:
    return werk_home() / "backends" / "llamacpp"


def new_generation() -> str:
    return "g_" + secrets.token_hex(8)


def free_port() -> int:
    """A currently free loopback port (the child binds it a moment later; a lost race shows
    up as a bind failure, which the caller retries with a new port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=False, exist_ok=False)
    os.chmod(path, 0o700)


def _ensure_root(root: Path) -> None:
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(root, 0o700)


def sweep_stale_generations(root: Path) -> list[str]:
    """Remove generation directories whose owner is gone (their ``lock`` is not held)."""
    removed: list[str] = []
    if not root.is_dir():
        return removed
    for entry in root.iterdir():
        if not entry.name.startswith("g_") or entry.is_symlink() or not entry.is_dir():
            continue
        lock = entry / "lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
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


def _pdeathsig(parent_pid: int) -> Callable[[], None]:
    """``preexec_fn``: ask the kernel to SIGKILL the child when its parent thread dies.

    The parent may already have died between ``fork`` and ``prctl``; then ``getppid`` differs
    and the child exits at once."""
    libc = _libc

    def run() -> None:
        if libc is not None:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(1)

    return run


class Child:
    """One spawned ``llama-server`` process and its generation directory."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        generation: str,
        gen_dir: Path,
        log_path: Path,
        lock_fd: int,
        port: int,
    ) -> None:
        self.popen = popen
        self.generation = generation
        self.gen_dir = gen_dir
        self.log_path = log_path
        self.port = port
        self._lock_fd: int | None = lock_fd
        self._pidfd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._on_exit: list[Callable[[int], None]] = []
        self._exit_reported = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        """The exit code once the child has exited (and reap it), else ``None``."""
        code = self.popen.poll()
        if code is not None:
            self._report_exit(code)
        return code

    def on_exit(self, callback: Callable[[int], None]) -> None:
        """Call ``callback(returncode)`` once when the child exits (immediately if it has)."""
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
                log.exception("llama-server exit callback failed")

    def watch(self) -> bool:
        """Watch the child's pidfd on the running asyncio loop; ``False`` if unavailable."""
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
            loop.add_reader(fd, self._pidfd_ready)
        except (NotImplementedError, OSError):
            os.close(fd)
            return False
        self._pidfd, self._loop, self._loop_thread = fd, loop, threading.get_ident()
        self.poll()  # it may have exited before the watch began
        return True

    def _pidfd_ready(self) -> None:
        if self.poll() is None:  # spurious wake-up
            return

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

    def kill_now(self) -> None:
        """SIGKILL and reap, synchronously (startup failures and cancellation)."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait()
        self.poll()

    async def terminate(self, grace: float = TERM_GRACE_SECONDS) -> int:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; always reaps. Idempotent."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.terminate()
            deadline = time.monotonic() + grace
            delay = 0.01
            while self.poll() is None and time.monotonic() < deadline:
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.05)
            if self.poll() is None:
                log.warning("llama-server %s ignored SIGTERM; killing it", self.pid)
                self.kill_now()
        code = self.popen.returncode
        assert code is not None
        return code

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def remove_dir(self) -> None:
        """Delete the generation directory and release its lock (after the child is reaped)."""
        shutil.rmtree(self.gen_dir, ignore_errors=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def prepare_generation(root: Path, generation: str) -> tuple[Path, Path, int]:
    """Create ``root/<generation>`` (0700) with ``slots/`` (0700) and a held ``lock``."""
    _ensure_root(root)
    sweep_stale_generations(root)
    gen_dir = root / generation
    _make_private_dir(gen_dir)
    _make_private_dir(gen_dir / "slots")
    _make_private_dir(gen_dir / "config")
    fd = os.open(
        gen_dir / "lock", os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return gen_dir, gen_dir / "slots", fd


def spawn_child(
    executable: Path,
    argv: Sequence[str],
    *,
    generation: str,
    gen_dir: Path,
    lock_fd: int,
    port: int,
) -> Child:
    """Start the process (call from the event-loop thread: see the module docstring)."""
    log_path = gen_dir / "server.log"
    env = child_environment()
    # llama.cpp reads ~/.config/llama.cpp/config.ini (XDG_CONFIG_HOME); give it an empty one.
    env["XDG_CONFIG_HOME"] = str(gen_dir / "config")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        popen = subprocess.Popen(
            [str(executable), *argv],
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=gen_dir,
            start_new_session=True,
            preexec_fn=_pdeathsig(os.getpid()),  # PDEATHSIG: see the module docstring
        )
    finally:
        os.close(log_fd)
    return Child(
        popen, generation=generation, gen_dir=gen_dir, log_path=log_path, lock_fd=lock_fd, port=port
    )


_BIND = re.compile(r"couldn't bind|Address already in use|failed to bind", re.I)
_LINE = re.compile(r"^\s*[\d.]+\s+([EWIDT])\s+(?:[\w]+\s+)?(?:[\w:~<>]+:\s+)?(.*)$")
_PATH = re.compile(r"(?<![\w.])/[^\s'\"]+")
_PATTERNS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"unknown model architecture: '([^']*)'"), lambda m: m.group(0)),
    (re.compile(r"error loading model: (.+)$"), lambda m: m.group(1)),
    (re.compile(r"error: invalid argument: (\S+)"), lambda m: f"invalid argument {m.group(1)}"),
    (re.compile(r'error while handling argument "([^"]+)": (.+)$'), lambda m: m.group(0)),
    (_BIND, lambda m: "could not bind its loopback port"),
)


def _sanitize(text: str, limit: int = 200) -> str:
    text = _PATH.sub("<path>", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def startup_failure(log_text: str) -> str:
    """The most telling reason in a failed child's log, without absolute paths.

    ``E`` (error) lines are searched for known causes (unknown architecture, model load
    errors, invalid arguments, bind failures); otherwise the last error line is used.
    """
    errors: list[str] = []
    for raw in log_text.splitlines():
        m = _LINE.match(raw)
        if (m.group(1) == "E") if m is not None else raw.lower().startswith("error"):
            errors.append(raw)
    for pattern, render in _PATTERNS:
        for line in errors:
            found = pattern.search(line)
            if found is not None:
                return _sanitize(render(found))
    if errors:
        last = _LINE.match(errors[-1])
        return _sanitize(last.group(2) if last is not None else errors[-1])
    return "no error message in its log"


def is_bind_failure(log_text: str) -> bool:
    return _BIND.search(log_text) is not None


# -------------------------------------------------------------------------------------------
# /v1 slot choice
# -------------------------------------------------------------------------------------------

PREFIX_KEY_CHARS = 8192
SIMILARITY = 0.1


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # binary search on slice equality (C-speed comparisons)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class SlotPicker:
    """Chooses the slot for each ``/v1`` request among the general slots (never a state slot).

    llama-server would otherwise pick any idle slot, including the one holding a named state.
    The picker keeps llama-server's own preferences: an idle slot whose last prompt shares the
    longest prefix with this one (over 10 % of it, so ``cache_prompt`` reuse still works), else
    the least recently used idle slot; when every slot is busy, the least loaded one
    (llama-server queues the request until that slot frees up).
    """

    def __init__(self, slots: Sequence[int]) -> None:
        if not slots:
            raise ValueError("no general slots")
        self.slots = tuple(slots)
        self._busy = dict.fromkeys(self.slots, 0)
        self._used = dict.fromkeys(self.slots, 0.0)
        self._key = dict.fromkeys(self.slots, "")

    def acquire(self, key: str) -> int:
        key = key[:PREFIX_KEY_CHARS]
        least = min(self._busy.values())
        candidates = [s for s in self.slots if self._busy[s] == least]
        slot = max(candidates, key=lambda s: (self._affinity(key, s), -self._used[s]))
        self._busy[slot] += 1
        self._used[slot] = time.monotonic()
        self._key[slot] = key
        return slot

    def _affinity(self, key: str, slot: int) -> int:
        """The shared prefix, if it is more than llama-server's default similarity threshold
        (10 % of the prompt; shared chat-JSON boilerplate alone does not count)."""
        common = _common_prefix(key, self._key[slot])
        return common if common > SIMILARITY * len(key) else 0

    def release(self, slot: int) -> None:
        if self._busy.get(slot, 0) > 0:
            self._busy[slot] -= 1

    def in_flight(self) -> int:
        return sum(self._busy.values())


# -------------------------------------------------------------------------------------------
# The runtime lifecycle: BackendDescriptor.start / .stop
# -------------------------------------------------------------------------------------------

HEALTH_POLL_MAX_SECONDS = 0.1
BIND_ATTEMPTS = 3


@dataclass(eq=False)
class ManagedHandle(LlamaHandle):
    """The :class:`LlamaHandle` of a Werk-managed child, plus what only the process layer uses.

    :ivar child: the process.
    :ivar fresh_http: a client without keep-alive, for the proxy's one retry on a new
        connection.
    :ivar inspection: the executable's inspection (``flags``, ``version``, ``sha256``).
    :ivar model_alias: the model name the child expects in ``/v1`` bodies.
    :ivar n_ctx: the context of one slot (``/props``).
    :ivar picker: chooses a ``/v1`` slot (never one of ``state_slots``).
    """

    child: Child = field(kw_only=True)
    fresh_http: httpx.AsyncClient = field(kw_only=True)
    inspection: Inspection = field(kw_only=True)
    model_alias: str = field(kw_only=True)
    n_ctx: int = field(kw_only=True)
    picker: SlotPicker = field(kw_only=True)
    stopped: bool = field(default=False, kw_only=True)


def _clients(base_url: str, api_key: str) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    # identity: the relay passes bytes through; it never has to undo a compression.
    headers = {"Authorization": f"Bearer {api_key}", "Accept-Encoding": "identity"}
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=60.0)
    pooled = httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=timeout,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        trust_env=False,  # never route loopback traffic through an HTTP(S)_PROXY
    )
    fresh = httpx.AsyncClient(
        base_url=base_url,
        headers=headers,
        timeout=timeout,
        limits=httpx.Limits(max_connections=64, max_keepalive_connections=0),
        trust_env=False,
    )
    return pooled, fresh


def _model_file(spec: ModelSpec) -> Path:
    if not spec.files:
        raise InvalidRequest(f"model {spec.id!r} has no files")
    return spec.files[0]


async def _wait_ready(child: Child, http: httpx.AsyncClient, timeout: float) -> None:
    """Poll ``/health`` until it answers 200, the child exits, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        code = child.poll()
        if code is not None:
            raise _StartupExit(code)
        try:
            response = await http.get("/health", timeout=2.0)
            if response.status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() >= deadline:
            raise WerkTimeout(
                f"llama-server did not become ready within {timeout:.0f}s",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        await anyio.sleep(delay)
        delay = min(delay * 1.5, HEALTH_POLL_MAX_SECONDS)


class _StartupExit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _listens_on(pid: int, port: int) -> bool | None:
    """Whether ``pid`` has a LISTEN socket on ``port`` (``None``: cannot tell)."""
    try:
        proc = psutil.Process(pid)
        conns = proc.net_connections(kind="inet")
    except (psutil.Error, OSError):
        return None
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


async def _props(http: httpx.AsyncClient) -> tuple[int, int, str]:
    """``(total_slots, n_ctx per slot, model_alias)`` from the child's ``/props``."""
    try:
        response = await http.get("/props", timeout=10.0)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        body = None
    if not isinstance(body, dict):
        raise BackendError("llama-server did not answer /props after it became ready")
    total = body.get("total_slots")
    settings = body.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    alias = body.get("model_alias")
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise BackendError("llama-server reported no usable slots in /props")
    return total, n_ctx if isinstance(n_ctx, int) else 0, alias if isinstance(alias, str) else ""


def _fail(spec: ModelSpec, child: Child, code: int) -> BackendError:
    tail = child.log_tail()
    log.error(
        "llama-server for model %s exited with %s during startup; log tail:\n%s",
        spec.id,
        code,
        tail,
    )
    return BackendError(f"llama-server exited during startup: {startup_failure(tail)}")


async def _spawn_ready(
    spec: ModelSpec,
    inspection: Inspection,
    options: LaunchOptions,
    generation: str,
    gen_dir: Path,
    slot_dir: Path,
    lock_fd: int,
) -> tuple[Child, BuiltArgs, str, httpx.AsyncClient, httpx.AsyncClient]:
    """Spawn and wait for readiness, retrying a lost port race; the child is killed on failure."""
    for attempt in range(1, BIND_ATTEMPTS + 1):
        port, api_key = free_port(), secrets.token_urlsafe(32)
        built = build_args(
            inspection,
            model=_model_file(spec),
            port=port,
            api_key=api_key,
            slot_dir=slot_dir,
            alias=spec.id,
            options=options,
        )
        child = spawn_child(
            inspection.path,
            built.argv,
            generation=generation,
            gen_dir=gen_dir,
            lock_fd=lock_fd,
            port=port,
        )
        base_url = f"http://127.0.0.1:{port}"
        http, fresh = _clients(base_url, api_key)
        try:
            await _wait_ready(child, http, options.startup_timeout)
            code = child.poll()
            if code is not None or _listens_on(child.pid, port) is False:
                # It exited, or something else answered on its port.
                raise _StartupExit(code if code is not None else -1)
            return child, built, api_key, http, fresh
        except _StartupExit as exc:
            child.kill_now()
            await _close(http, fresh)
            if attempt < BIND_ATTEMPTS and is_bind_failure(child.log_tail()):
                log.warning("llama-server lost the race for port %s; retrying", port)
                continue
            raise _fail(spec, child, exc.code) from None
        except BaseException:
            child.kill_now()
            with anyio.CancelScope(shield=True):
                await _close(http, fresh)
            raise
    raise AssertionError("unreachable")


async def _close(*clients: httpx.AsyncClient) -> None:
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()


def _remove_generation(gen_dir: Path, lock_fd: int) -> None:
    shutil.rmtree(gen_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(lock_fd)


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: inspect, spawn, wait for readiness, verify, describe.

    :raises werk.Unavailable: no usable executable (or it changed while starting).
    :raises werk.InvalidRequest: bad model options or reserved native arguments.
    :raises werk.BackendError: the child exited during startup (with the reason from its log).
    :raises werk.WerkTimeout: it did not become ready in time.
    """
    located = locate_llama_server(spec.options)
    if located.path is None:
        raise Unavailable(
            f"no llama-server executable: {located.reason}",
            capability=CapabilityId.MODEL_RESIDENCY,
        )
    options = parse_options(spec.options)
    _model_file(spec)
    inspection = await inspect_executable(located.path)  # help, version and hash: all done
    generation = new_generation()
    gen_dir, slot_dir, lock_fd = await anyio.to_thread.run_sync(
        prepare_generation, generation_root(), generation
    )
    try:
        child, built, api_key, http, fresh = await _spawn_ready(
            spec, inspection, options, generation, gen_dir, slot_dir, lock_fd
        )
    except BaseException:
        _remove_generation(gen_dir, lock_fd)
        raise
    try:
        total_slots, n_ctx, alias = await _props(http)
        await verify_unchanged(inspection)
        blockers = state_blockers(built, inspection)
        if total_slots < 1 + STATE_SLOT_COUNT:
            blockers.append(f"only {total_slots} slot(s); named states need a reserved slot")
        state_slots = () if blockers else tuple(range(total_slots - STATE_SLOT_COUNT, total_slots))
        general = tuple(i for i in range(total_slots) if i not in state_slots)
        handle = ManagedHandle(
            base_url=f"http://127.0.0.1:{child.port}",
            api_key=api_key,
            http=http,
            pid=child.pid,
            generation=generation,
            slot_dir=slot_dir,
            total_slots=total_slots,
            state_slots=state_slots,
            help_text=inspection.help_text,
            args=built.redacted(),
            log_path=child.log_path,
            child=child,
            fresh_http=fresh,
            inspection=inspection,
            model_alias=alias or spec.id,
            n_ctx=n_ctx,
            picker=SlotPicker(general),
        )
        if blockers:
            handle.probe = ProbeResult(
                ProbeStatus.FAILED, "native persistence is disabled: " + "; ".join(blockers)
            )
        runtime = Runtime(
            backend=spec.backend,
            model=spec,
            generation=generation,
            handle=handle,
            executable=f"sha256:{inspection.sha256}",
            args=built.public,
            cache_layout=(
                f"llama.cpp slots v1 n_ctx={n_ctx} n_parallel={total_slots} "
                f"state_slots={','.join(map(str, state_slots)) or 'none'}"
            ),
        )
    except BaseException:
        child.kill_now()
        with anyio.CancelScope(shield=True):
            await _close(http, fresh)
        child.remove_dir()
        raise

    def died(code: int) -> None:
        if not handle.stopped:
            runtime.alive = False
            log.error(
                "llama-server %s (generation %s, model %s) exited with %s; log tail:\n%s",
                child.pid,
                generation,
                spec.id,
                code,
                child.log_tail(4096),
            )

    child.on_exit(died)
    child.watch()
    log.info(
        "llama-server %s ready for model %s (generation %s, %s, port %s)",
        child.pid,
        spec.id,
        generation,
        inspection.version,
        child.port,
    )
    return runtime


def check_alive(runtime: Runtime) -> bool:
    """Poll the child (reaping it if it exited); marks the runtime dead. Cheap."""
    handle = runtime.handle
    if not isinstance(handle, ManagedHandle):
        return runtime.alive  # not a process this layer manages: trust the flag
    if handle.stopped or handle.child.poll() is not None:
        runtime.alive = False
    return runtime.alive


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: SIGTERM, wait, SIGKILL, reap, delete the generation
    directory. Idempotent; shielded from cancellation so shutdown always completes."""
    handle = runtime.handle
    runtime.alive = False
    if not isinstance(handle, ManagedHandle) or handle.stopped:
        return
    handle.stopped = True
    with anyio.CancelScope(shield=True):
        code = await handle.child.terminate()
        await _close(handle.http, handle.fresh_http)
        await anyio.to_thread.run_sync(handle.child.remove_dir)
    log.info("llama-server %s (generation %s) stopped (%s)", handle.pid, handle.generation, code)
