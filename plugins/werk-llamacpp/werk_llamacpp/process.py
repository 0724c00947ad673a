"""One managed ``llama-server`` child: spawn, readiness, crash detection, stop.

Each start spawns exactly one child, bound to ``127.0.0.1`` on a free port, with a random
per-child API key, and a private generation directory (0700)::

    WERK_HOME/backends/llamacpp/g_<hex>/   lock, server.log (stdout+stderr), slots/ (0700)

The generation directory belongs to the child's lifetime: :meth:`Child.remove_dir` deletes it
on stop (state files the host has not moved into its catalog are the child's private temporary
files). A directory left behind by a Werk that was SIGKILLed is recognised by its unlocked
``lock`` file (an ``flock`` held for the child's lifetime) and removed by the next start.

**Supervision is the host's** (:mod:`werk.supervise`): the child is a
:class:`werk.SupervisedProcess` (own process group, fork-safe parent-death signal, pidfd exit
detection and reaping, stop by group, log tail) and its generation directory a
:class:`werk.WorkDir`. Spawn only from the long-lived event-loop thread (what
:func:`spawn_child` is called from in ``werk serve``): Linux delivers the parent-death signal
when the spawning *thread* exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from werk import (
    BackendError,
    CapabilityId,
    LoopbackClient,
    LoopbackError,
    ModelSpec,
    PreparedPages,
    ProcessExited,
    Runtime,
    SupervisedProcess,
    Unavailable,
    WorkDir,
    child_api_key,
    free_port,
    listens_on,
    wait_until_ready,
    werk_home,
)

from . import __version__
from .args import (
    BuiltArgs,
    LaunchOptions,
    build_args,
    model_file,
    parse_options,
    reserved_state_slots,
    state_blockers,
)
from .canary import lineage_of
from .executable import locate_llama_server
from .expert_pages import prepare_expert_pages
from .handle import LlamaHandle, ProbeResult, ProbeStatus
from .inspect import (
    Inspection,
    child_environment,
    inspect_executable,
    start_rehash,
    verify_unchanged,
)
from .probe import start_early_probe
from .slot_picker import SlotPicker
from .slots import INFERENCE_TIMEOUT

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = [
    "Child",
    "ManagedHandle",
    "SlotPicker",
    "check_alive",
    "generation_root",
    "new_generation",
    "prepare_generation",
    "spawn_child",
    "start_runtime",
    "startup_failure",
    "stop_runtime",
]

log = logging.getLogger("werk.llamacpp")


def generation_root() -> Path:
    return werk_home() / "backends" / "llamacpp"


def new_generation() -> str:
    return "g_" + secrets.token_hex(8)


class Child(SupervisedProcess):
    """One spawned ``llama-server`` process, its port and its generation directory."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        *,
        generation: str,
        workdir: WorkDir,
        log_path: Path,
        port: int,
    ) -> None:
        super().__init__(popen, log_path=log_path, name="llama-server")
        self.log_path: Path = log_path  # always set for a child (narrower than the base's)
        self.generation = generation
        self.workdir = workdir
        self.port = port

    @property
    def gen_dir(self) -> Path:
        return self.workdir.path

    def remove_dir(self) -> None:
        """Delete the generation directory and release its lock (after the child is reaped)."""
        self.workdir.release()


def prepare_generation(root: Path, generation: str) -> WorkDir:
    """``root/<generation>`` (0700) with ``slots/`` and ``config/`` (0700) and a held lock;
    generation directories a killed Werk left behind are removed first."""
    return WorkDir.create(root, generation, subdirs=("slots", "config"))


def spawn_child(
    executable: Path, argv: Sequence[str], *, generation: str, workdir: WorkDir, port: int
) -> Child:
    """Start the process (call from the event-loop thread: see the module docstring)."""
    env = child_environment()
    # llama.cpp reads ~/.config/llama.cpp/config.ini (XDG_CONFIG_HOME); give it an empty one.
    env["XDG_CONFIG_HOME"] = str(workdir.path / "config")
    spawned = SupervisedProcess.spawn(
        [executable, *argv], log_path=workdir.path / "server.log", env=env, cwd=workdir.path
    )
    return Child(
        spawned.popen,
        generation=generation,
        workdir=workdir,
        log_path=workdir.path / "server.log",
        port=port,
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
# The runtime lifecycle: BackendDescriptor.start / .stop
# -------------------------------------------------------------------------------------------

BIND_ATTEMPTS = 3


@dataclass(eq=False)
class ManagedHandle(LlamaHandle):
    """The :class:`LlamaHandle` of a Werk-managed child, plus what only the process layer uses.

    :ivar child: the process.
    :ivar v1: the host's pooled loopback client for the ``/v1`` relay (the hot path; the
        proxy's one retry goes through it on a new connection).
    :ivar inspection: the executable's inspection (``flags``, ``version``, ``sha256``).
    :ivar model_alias: the model name the child expects in ``/v1`` bodies.
    :ivar n_ctx: the context of one slot (``/props``).
    :ivar picker: chooses a ``/v1`` slot (never one of ``state_slots``).
    :ivar prepared: the expert pages prepared before the spawn (mappings retained until stop).
    :ivar early_probe: the state probe started when the child became ready because an earlier
        generation left a canary (:func:`~werk_llamacpp.probe.start_early_probe`).
    """

    child: Child = field(kw_only=True)
    v1: LoopbackClient = field(kw_only=True)
    inspection: Inspection = field(kw_only=True)
    model_alias: str = field(kw_only=True)
    n_ctx: int = field(kw_only=True)
    picker: SlotPicker = field(kw_only=True)
    stopped: bool = field(default=False, kw_only=True)
    prepared: PreparedPages | None = field(default=None, kw_only=True)
    early_probe: asyncio.Task[ProbeResult] | None = field(default=None, kw_only=True)


def _child_client(
    port: int, api_key: str, *, read_timeout: float, max_idle: int, spare: int = 0
) -> LoopbackClient:
    return LoopbackClient(
        "127.0.0.1",
        port,
        headers={"Authorization": f"Bearer {api_key}"},
        connect_timeout=10.0,
        write_timeout=60.0,
        read_timeout=read_timeout,
        max_idle=max_idle,
        spare=spare,
    )


def _relay_client(port: int, api_key: str) -> LoopbackClient:
    """The ``/v1`` relay client (also used for readiness: ``/health``, ``/props``). One spare
    connection: llama-server closes the connection after every streamed response, and the next
    streamed request would otherwise wait for a connect (0.2-0.4 ms here)."""
    return _child_client(port, api_key, read_timeout=600.0, max_idle=16, spare=1)


def _control_client(port: int, api_key: str) -> LoopbackClient:
    """The client for state-slot requests (``LlamaHandle.http``: ``/slots``, ``/tokenize``,
    slot-bound ``/completion``). Its own pool, and a read wait as long as the longest call's
    bound (a non-streamed prefill of a long prompt sends nothing until it is done); each call
    is bounded by its own timeout (:func:`werk_llamacpp.slots.llama_json`)."""
    return _child_client(port, api_key, read_timeout=INFERENCE_TIMEOUT, max_idle=4)


PROPS_LIMIT_BYTES = 16 << 20


async def _get_json(relay: LoopbackClient, path: str, timeout: float) -> tuple[int, object]:
    """``(status, decoded body or None)`` of one GET; raises LoopbackError."""
    status, raw = await relay.fetch("GET", path, timeout=timeout, limit=PROPS_LIMIT_BYTES)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


async def _wait_ready(child: Child, relay: LoopbackClient, timeout: float) -> None:
    """Poll ``/health`` until it answers 200, the child exits, or ``timeout`` passes."""

    async def healthy() -> bool:
        try:
            status, _ = await _get_json(relay, "/health", 2.0)
        except (LoopbackError, TimeoutError):
            return False
        return status == 200

    await wait_until_ready(child, healthy, timeout=timeout, what="llama-server")


async def _props(relay: LoopbackClient) -> tuple[int, int, str]:
    """``(total_slots, n_ctx per slot, model_alias)`` from the child's ``/props``."""
    try:
        status, body = await _get_json(relay, "/props", 10.0)
    except (LoopbackError, TimeoutError):
        body = None
    else:
        body = body if status == 200 else None
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
    slot_dir: Path,
    workdir: WorkDir,
) -> tuple[Child, BuiltArgs, str, LoopbackClient]:
    """Spawn and wait for readiness, retrying a lost port race; the child is killed on failure."""
    for attempt in range(1, BIND_ATTEMPTS + 1):
        port, api_key = free_port(), child_api_key()
        built = build_args(
            inspection,
            model=model_file(spec),
            port=port,
            api_key=api_key,
            slot_dir=slot_dir,
            alias=spec.id,
            options=options,
        )
        child = spawn_child(
            inspection.path, built.argv, generation=generation, workdir=workdir, port=port
        )
        relay = _relay_client(port, api_key)
        try:
            await _wait_ready(child, relay, options.startup_timeout)
            code = child.poll()
            if code is not None or listens_on(child.pid, port) is False:
                # It exited, or something else answered on its port.
                raise ProcessExited(code if code is not None else -1)
            return child, built, api_key, relay
        except ProcessExited as exc:
            child.kill_now()
            await _close(relay)
            if attempt < BIND_ATTEMPTS and is_bind_failure(child.log_tail()):
                log.warning("llama-server lost the race for port %s; retrying", port)
                continue
            raise _fail(spec, child, exc.code) from None
        except BaseException:
            child.kill_now()
            with anyio.CancelScope(shield=True):
                await _close(relay)
            raise
    raise AssertionError("unreachable")


async def _close(*clients: LoopbackClient) -> None:
    for client in clients:
        with contextlib.suppress(Exception):
            await client.aclose()


async def start_runtime(
    spec: ModelSpec, *, rehash: tuple[Inspection, Future[str]] | None = None
) -> Runtime:
    """``BackendDescriptor.start``: inspect, spawn, wait for readiness, verify, describe.

    ``rehash``: a re-hash of the executable the caller began (:func:`start_rehash`) for the
    inspection it found; used for the check after readiness when this start inspects the same
    executable identity, otherwise one is begun here, before the spawn.

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
    model_file(spec)
    inspection = await inspect_executable(located.path)  # help, version and hash: all done
    # Every preparation worker is joined (and its mappings dropped on any stop) before this
    # returns: the child never starts while Werk is still reading the file.
    prepared = await prepare_expert_pages(model_file(spec), options.native_args, inspection)
    if prepared is not None:
        log.info("expert pages of model %s: %s", spec.id, prepared.report.outcome)
    try:
        generation = new_generation()
        workdir = await anyio.to_thread.run_sync(prepare_generation, generation_root(), generation)
    except BaseException:
        if prepared is not None:
            prepared.close()
        raise
    slot_dir = workdir.path / "slots"
    if rehash is not None and rehash[0] is inspection:
        digest = rehash[1]
    else:
        digest = start_rehash(inspection)  # for the post-readiness check, while the child loads
    try:
        child, built, api_key, relay = await _spawn_ready(
            spec, inspection, options, generation, slot_dir, workdir
        )
    except BaseException:
        workdir.release()
        if prepared is not None:
            prepared.close()
        raise
    control = _control_client(child.port, api_key)
    try:
        total_slots, n_ctx, alias = await _props(relay)
        await verify_unchanged(inspection, digest)
        blockers = state_blockers(built, inspection)
        reserved = reserved_state_slots(options)
        if reserved == 0:
            blockers.append("an embeddings model (option embeddings) keeps no named states")
        elif total_slots < 1 + reserved:
            blockers.append(
                f"only {total_slots} slot(s); named states need {reserved} reserved slot(s)"
            )
        state_slots = () if blockers else tuple(range(total_slots - reserved, total_slots))
        general = tuple(i for i in range(total_slots) if i not in state_slots)
        cache_layout = (
            f"llama.cpp slots v1 n_ctx={n_ctx} n_parallel={total_slots} "
            f"state_slots={','.join(map(str, state_slots)) or 'none'}"
        )
        handle = ManagedHandle(
            base_url=f"http://127.0.0.1:{child.port}",
            api_key=api_key,
            http=control,
            pid=child.pid,
            generation=generation,
            slot_dir=slot_dir,
            total_slots=total_slots,
            state_slots=state_slots,
            help_text=inspection.help_text,
            args=built.redacted(),
            log_path=child.log_path,
            child=child,
            v1=relay,
            inspection=inspection,
            model_alias=alias or spec.id,
            n_ctx=n_ctx,
            picker=SlotPicker(general),
            hold_seconds=options.state_hold_seconds,
            wait_seconds=options.state_wait_seconds,
            prepared=prepared,
            lineage=lineage_of(
                executable=f"sha256:{inspection.sha256}",
                model_identity=spec.identity,
                args=built.public,
                cache_layout=cache_layout,
                adapter=f"werk-llamacpp {__version__}",
            ),
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
            cache_layout=cache_layout,
            pid=child.pid,
            preparation=None if prepared is None else prepared.report,
        )
    except BaseException:
        child.kill_now()
        with anyio.CancelScope(shield=True):
            await _close(control, relay)
        child.remove_dir()
        if prepared is not None:
            prepared.close()
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
    handle.early_probe = start_early_probe(handle)
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
        if handle.early_probe is not None:
            handle.early_probe.cancel()  # its clean-up (erase, unlink) runs before the stop
            await asyncio.gather(handle.early_probe, return_exceptions=True)
        code = await handle.child.terminate()
        if handle.prepared is not None:
            handle.prepared.close()  # before the host's model file-cache release
        await _close(handle.http, handle.v1)
        await anyio.to_thread.run_sync(handle.child.remove_dir)
    log.info("llama-server %s (generation %s) stopped (%s)", handle.pid, handle.generation, code)
