"""Werk-started ``omlx serve`` workers for one model runtime.

A worker is ``omlx serve --model-dir <base>/models --host 127.0.0.1 --port <free> --api-key
<random> --base-path <base>`` plus, with the prefix cache, ``--paged-ssd-cache-dir
<base>/cache/prefix-cache --paged-ssd-cache-max-size 4GB`` (else ``--no-cache``). ``<base>`` is
private to the worker: ``WERK_HOME/backends/omlx/workers/<key>/``, where ``<key>`` is derived
from the model's manifest identity, whether the prefix cache is on, and the partition below;
``<base>/models/`` holds one symbolic link, named after the Werk model id, to the model's
directory, so the worker sees only the selected model. Inherited ``OMLX_*`` variables are
removed from its environment (they would override these flags). It is a
:class:`werk.SupervisedProcess` with ``guard_group``: its own process group, gone with a
SIGKILLed Werk, stopped by group. Readiness: ``GET /health``, then ``GET /v1/models/status``
must list the model, then ``POST /v1/models/{id}/load``.

**Partitions.** oMLX's prefix cache is shared by every request a worker serves, and it has no
per-request salt. With the prefix cache on, each API key therefore gets its own worker (keyed
by the request's ``cache_salt``), so one key never reuses, or times, another key's cached
prompts; with it off one worker serves every key. Workers start on the first request of their
partition and live while the runtime lives.

**Crashes.** A worker that exits is reaped (the supervisor's watcher) and the next request of
its partition starts a new one; a second consecutive failure waits 1 s, then 2, 4, … up to
30 s before the next start (``unavailable``, retryable, until then).

``<base>/worker.lock`` is ``flock``-ed while a worker runs: ``werk cache`` reports the directory
active and never removes it then; another Werk on the same ``WERK_HOME`` cannot start the same
worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from werk import (
    BackendError,
    CapabilityId,
    InvalidRequest,
    LoopbackClient,
    LoopbackError,
    ModelSpec,
    PersistenceDefaults,
    ProcessExited,
    Retention,
    Reuse,
    Runtime,
    SupervisedProcess,
    Unavailable,
    child_api_key,
    free_port,
    replace_private_file,
    wait_until_ready,
    werk_home,
)

from .experts import ExpertAdapter, Unsupported, adapter_for
from .installation import Inspection, Installation, inspect_omlx, locate, require_flags
from .reuse import ReuseCounter

__all__ = [
    "CACHE_BOUND",
    "LIVE",
    "OmlxHandle",
    "Worker",
    "cache_enabled",
    "generated_flags",
    "start_runtime",
    "stop_runtime",
    "workers_root",
]

log = logging.getLogger("werk.omlx")

CACHE_BOUND = "4GB"
TIMEOUT_ENV = "WERK_OMLX_HEALTH_TIMEOUT_SECONDS"
SHARED = "shared"
MAX_BACKOFF_SECONDS = 30.0


def workers_root(home: Path) -> Path:
    return home / "backends" / "omlx" / "workers"


def cache_enabled(persistence: PersistenceDefaults | None) -> bool:
    """The seed's rule: ``auto`` or ``disk`` retention with reuse other than ``disabled``."""
    return (
        persistence is not None
        and persistence.retention in (Retention.AUTO, Retention.DISK)
        and persistence.reuse is not Reuse.DISABLED
    )


def generated_flags(cache_on: bool, base: Path) -> list[str]:
    if not cache_on:
        return ["--no-cache"]
    return [
        "--paged-ssd-cache-dir",
        str(base / "cache" / "prefix-cache"),
        "--paged-ssd-cache-max-size",
        CACHE_BOUND,
    ]


def _key(identity: str, cache_on: bool, partition: str) -> str:
    material = f"{identity}\0{'prefix-cache' if cache_on else 'no-cache'}\0{partition}"
    return "w_" + hashlib.sha256(material.encode()).hexdigest()[:16]


@dataclass(eq=False)
class Worker:
    """One running ``omlx serve``."""

    key: str
    base: Path
    process: SupervisedProcess
    http: LoopbackClient
    """Pooled keep-alive connections to the worker, its key set (readiness, ``/v1``)."""
    lock_fd: int
    served: str
    counter: ReuseCounter = field(default_factory=ReuseCounter)
    stopped: bool = False

    def alive(self) -> bool:
        return not self.stopped and self.process.poll() is None

    async def stop(self) -> None:
        """Stop the whole process group, reap, release the directory lock (idempotent)."""
        if self.stopped:
            return
        self.stopped = True
        if self.process.poll() is None:
            await self.process.terminate(grace=10.0)
        await self.http.aclose()
        with contextlib.suppress(OSError):
            os.close(self.lock_fd)


@dataclass(eq=False)
class OmlxHandle:
    """A model runtime: its workers (one per partition) and what was inspected."""

    spec: ModelSpec
    model_dir: Path
    installation: Installation
    inspection: Inspection
    cache_on: bool
    workers: dict[str, Worker] = field(default_factory=dict)
    failures: dict[str, tuple[int, float]] = field(default_factory=dict)
    last_exit: str | None = None
    closed: bool = False
    experts: ExpertAdapter | None = None
    experts_reason: str = ""
    _lock: anyio.Lock = field(default_factory=anyio.Lock)

    def partition(self, cache_salt: str | None) -> str:
        if self.cache_on and cache_salt:
            return "key-" + hashlib.sha256(cache_salt.encode()).hexdigest()[:16]
        return SHARED

    def alive_workers(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive()]

    async def worker(self, partition: str) -> Worker:
        """The partition's running worker, started (or restarted) when needed."""
        async with self._lock:
            if self.closed:
                raise Unavailable("the oMLX runtime was stopped", retryable=True)
            current = self.workers.get(partition)
            if current is not None and current.alive():
                return current
            if current is not None:  # it exited: reaped already; release what it held
                await current.stop()
                del self.workers[partition]
            self._check_backoff(partition)
            try:
                started = await _spawn(self, partition)
            except BaseException:
                self._failed(partition)
                raise
            self.workers[partition] = started
            self.failures.pop(partition, None)
            return started

    def _check_backoff(self, partition: str) -> None:
        count, when = self.failures.get(partition, (0, 0.0))
        if count < 2:
            return
        wait = min(MAX_BACKOFF_SECONDS, 2.0 ** (count - 2))
        left = when + wait - time.monotonic()
        if left > 0:
            raise Unavailable(
                f"the oMLX worker for model {self.spec.id!r} failed {count} times in a row; "
                f"the next start is in {left:.0f} s",
                retryable=True,
            )

    def _failed(self, partition: str) -> None:
        count, _ = self.failures.get(partition, (0, 0.0))
        self.failures[partition] = (count + 1, time.monotonic())

    async def close(self) -> None:
        async with self._lock:
            self.closed = True
            for worker in self.workers.values():
                await worker.stop()
            self.workers.clear()


LIVE: set[OmlxHandle] = set()
"""The oMLX runtimes of this Werk process (capabilities without a runtime look here)."""


def _model_dir(spec: ModelSpec) -> Path:
    configs = sorted((p for p in spec.files if p.name == "config.json"), key=lambda p: len(p.parts))
    if not configs:
        raise InvalidRequest(f"model {spec.id!r} has no config.json: not an MLX model directory")
    return configs[0].parent


def _lock(base: Path) -> int:
    fd = os.open(base / "worker.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Unavailable(
            f"the oMLX worker directory {base.name} is in use by another Werk process",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=True,
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _prepare(handle: OmlxHandle, base: Path, served: str) -> None:
    """The private base directory: the model link, the record ``werk cache`` reads."""
    (base / "models").mkdir(parents=True, exist_ok=True, mode=0o700)
    link = base / "models" / served
    if link.is_symlink() or link.exists():
        if link.is_symlink() and Path(os.readlink(link)) == handle.model_dir:
            return _record(handle, base, served)
        link.unlink()
    link.symlink_to(handle.model_dir, target_is_directory=True)
    _record(handle, base, served)


def _record(handle: OmlxHandle, base: Path, served: str) -> None:
    record = {
        "schema": 1,
        "model": served,
        "identity": handle.spec.identity,
        "prefix_cache": handle.cache_on,
        "omlx_version": handle.inspection.version,
        "started_at": time.time(),
    }
    dir_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_private_file(dir_fd, "worker.json", (json.dumps(record) + "\n").encode())
    finally:
        os.close(dir_fd)


async def _spawn(handle: OmlxHandle, partition: str) -> Worker:
    spec = handle.spec
    key = _key(spec.identity, handle.cache_on, partition)
    base = workers_root(werk_home()) / key
    base.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock_fd = _lock(base)
    served = spec.id
    try:
        _prepare(handle, base, served)
    except OSError:
        os.close(lock_fd)
        raise
    port, api_key = free_port(), child_api_key()
    flags = generated_flags(handle.cache_on, base)
    argv = [
        str(handle.installation.path), "serve", "--model-dir", str(base / "models"),
        "--host", "127.0.0.1", "--port", str(port), "--api-key", api_key,
        "--base-path", str(base), *flags,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMLX_")}
    env.pop("PYTHONPATH", None)
    process = SupervisedProcess.spawn(
        argv, log_path=base / "werk-worker.log", env=env, cwd=base, name="omlx",
        guard_group=True,
    )  # fmt: skip
    http = LoopbackClient("127.0.0.1", port, headers={"Authorization": f"Bearer {api_key}"})
    worker = Worker(key=key, base=base, process=process, http=http, lock_fd=lock_fd, served=served)

    async def ready() -> bool:
        try:
            if (await http.fetch("GET", "/health", timeout=2.0))[0] != 200:
                return False
            status, listing = await http.fetch("GET", "/v1/models/status", timeout=5.0)
            if status != 200:
                return False
            models = json.loads(listing).get("models", [])
            listed = [m.get("id") for m in models if isinstance(m, dict)]
            if served not in listed:
                raise BackendError(f"oMLX does not list model {served!r} in its model directory")
            loaded, _ = await http.fetch("POST", f"/v1/models/{served}/load", timeout=600.0)
        except (LoopbackError, ValueError, AttributeError):
            return False
        if loaded != 200:
            raise BackendError(f"oMLX could not load model {served!r} (HTTP {loaded})")
        return True

    timeout = float(os.environ.get(TIMEOUT_ENV, "120"))
    try:
        await wait_until_ready(process, ready, timeout=timeout, what="oMLX")
    except ProcessExited as exc:
        tail = process.log_tail(2048).strip().splitlines()[-1:] or ["no output"]
        await worker.stop()
        raise BackendError(
            f"oMLX exited during startup (status {exc.code}): {tail[0][:200]}"
        ) from None
    except BaseException:
        await worker.stop()
        raise

    def died(code: int) -> None:
        if worker.stopped:
            return
        handle.last_exit = f"the oMLX worker (pid {process.pid}) exited with status {code}"
        handle._failed(partition)
        log.error(
            "oMLX for %s exited with %s; log tail:\n%s", spec.id, code, process.log_tail(4096)
        )

    process.on_exit(died)
    process.watch()
    log.info(
        "oMLX %s (pid %s, from %s) ready for model %s on port %s, prefix cache %s",
        handle.inspection.version, process.pid, handle.installation.source, spec.id, port,
        "on" if handle.cache_on else "off",
    )  # fmt: skip
    return worker


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: locate and inspect oMLX, check the generated flags; the
    workers start on the first request of their partition."""
    model_dir = _model_dir(spec)
    installation = locate()
    inspection = await inspect_omlx(installation)
    cache_on = cache_enabled(spec.persistence)
    base_flags = ["--model-dir", "--host", "--port", "--api-key", "--base-path"]
    require_flags(inspection, base_flags + generated_flags(cache_on, Path("/")))
    handle = OmlxHandle(
        spec=spec, model_dir=model_dir, installation=installation, inspection=inspection,
        cache_on=cache_on,
    )  # fmt: skip
    try:
        handle.experts = await anyio.to_thread.run_sync(adapter_for, model_dir)
    except Unsupported as exc:
        handle.experts_reason = str(exc)
    LIVE.add(handle)
    return Runtime(
        backend=spec.backend,
        model=spec,
        generation="g_" + secrets.token_hex(8),
        handle=handle,
        args=tuple(generated_flags(cache_on, Path("<worker>"))),
    )


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: stop every worker of the runtime (process groups), reap."""
    runtime.alive = False
    handle = runtime.handle
    if isinstance(handle, OmlxHandle):
        LIVE.discard(handle)
        await handle.close()
