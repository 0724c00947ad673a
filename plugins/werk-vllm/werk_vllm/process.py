"""One Werk-started local vLLM OpenAI server per model runtime (backend ``vllm``).

The child is ``<python> -m vllm.entrypoints.openai.api_server --model DIR --host 127.0.0.1
--port <free> --served-model-name <id> --api-key <random>``, then the generated flags
(``--enable-prompt-tokens-details``; with the server's persistence defaults
``--enable-prefix-caching``, or ``--no-enable-prefix-caching`` for reuse ``disabled``, unless
``WERK_VLLM_ARGS`` enables or disables it itself), then ``WERK_VLLM_ARGS`` (shell-split; a
reserved flag there is an error before anything starts). Every generated flag must be
advertised by the installation's ``--help=all`` (:mod:`.inspect`, once per installation), or
nothing is spawned.

The child is a :class:`werk.SupervisedProcess` with ``guard_group``: its own process group
(vLLM's API server starts an engine core and workers, and stopping only the server would orphan
them), guarded so that even a SIGKILLed Werk takes the whole group along, exit detection, stop
by group. Readiness is ``/health`` and then ``/v1/models``, polled every 250 ms up to
``WERK_VLLM_HEALTH_TIMEOUT_SECONDS`` (default 300; the tiny demo model takes about 60 s on two
cores). On a CPU build ``VLLM_CPU_KVCACHE_SPACE`` (GiB) defaults to a quarter of the available
memory, at most 4; an explicit value wins.

:data:`LIVE` lists the processes alive now: the prefix-cache row is about all of them.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from werk import (
    BackendError,
    InvalidRequest,
    LoopbackClient,
    LoopbackError,
    ModelSpec,
    PersistenceDefaults,
    ProcessExited,
    Reuse,
    Runtime,
    SupervisedProcess,
    WorkDir,
    child_api_key,
    free_port,
    wait_until_ready,
    werk_home,
)

from .installation import Inspection, Installation, inspect_vllm, locate, require_flags

__all__ = [
    "LIVE",
    "VllmHandle",
    "check_alive",
    "generated_flags",
    "launch_args",
    "start_runtime",
    "stop_runtime",
    "user_args",
]

log = logging.getLogger("werk.vllm")

ARGS_ENV = "WERK_VLLM_ARGS"
TIMEOUT_ENV = "WERK_VLLM_HEALTH_TIMEOUT_SECONDS"
KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
RESERVED = ("--model", "--host", "--port", "--served-model-name", "--api-key")
ENABLE_APC, DISABLE_APC = "--enable-prefix-caching", "--no-enable-prefix-caching"
PROMPT_DETAILS = "--enable-prompt-tokens-details"
_TAIL_ERROR = re.compile(r"\b\w*(?:Error|ERROR|error)\b[:\s].*$")


@dataclass(eq=False)
class VllmHandle:
    """What a vLLM runtime holds: the child, its loopback client (pooled keep-alive
    connections, the child's key set: readiness and the ``/v1`` relay), its effective
    arguments."""

    process: SupervisedProcess
    workdir: WorkDir
    http: LoopbackClient
    args: tuple[str, ...]
    installation: Installation
    inspection: Inspection
    stopped: bool = field(default=False)

    def alive(self) -> bool:
        return not self.stopped and self.process.poll() is None


LIVE: set[VllmHandle] = set()
"""The Werk-started vLLM processes of this Werk process (a stopped or dead one leaves)."""


def user_args() -> list[str]:
    """``WERK_VLLM_ARGS`` split like a shell would; a reserved flag is an ``InvalidRequest``."""
    try:
        args = shlex.split(os.environ.get(ARGS_ENV, ""))
    except ValueError as exc:
        raise InvalidRequest(f"{ARGS_ENV} is not valid shell syntax: {exc}") from None
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in RESERVED:
            raise InvalidRequest(f"{ARGS_ENV} may not set {flag}: Werk chooses it")
    return args


def generated_flags(persistence: PersistenceDefaults | None, user: list[str]) -> list[str]:
    """The flags Werk adds: prompt-token details always (``/v1`` usage then carries vLLM's
    ``cached_tokens``); with persistence defaults the APC switch, unless the user set one."""
    flags = [PROMPT_DETAILS]
    explicit = {a.split("=", 1)[0] for a in user} & {ENABLE_APC, DISABLE_APC}
    if persistence is not None and not explicit:
        flags.append(DISABLE_APC if persistence.reuse is Reuse.DISABLED else ENABLE_APC)
    return flags


def launch_args(
    model_dir: Path,
    model_id: str,
    port: int,
    api_key: str,
    generated: list[str],
    user: list[str],
) -> list[str]:
    """The server's arguments (the API key included: never log these)."""
    return [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        model_id,
        "--api-key",
        api_key,
        *generated,
        *user,
    ]


def _kv_space_gib() -> str:
    available = psutil.virtual_memory().available
    return str(max(1, min(4, available // (4 * 2**30))))


def _model_dir(spec: ModelSpec) -> Path:
    for path in spec.files:
        if path.name == "config.json":
            return path.parent
    raise InvalidRequest(f"model {spec.id!r} has no config.json: not a vLLM model directory")


def _startup_failure(tail: str) -> str:
    """The last error line of the child's log with its first indented detail line (pydantic
    puts the reason there), bounded and without paths."""
    lines = tail.splitlines()
    for index in range(len(lines) - 1, -1, -1):
        found = _TAIL_ERROR.search(lines[index])
        if not found:
            continue
        text = found.group(0).strip()
        detail = lines[index + 1] if index + 1 < len(lines) else ""
        if detail[:1].isspace() and not detail.strip().startswith(("File ", "For further")):
            text = f"{text}: {detail.strip()}"
        return re.sub(r"(?<![\w.])/[^\s'\"]+", "<path>", text)[:300]
    return "no error message in its log"


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: check, inspect, spawn, wait for readiness, describe."""
    model_dir = _model_dir(spec)
    user = user_args()
    installation = locate()
    inspection = await inspect_vllm(installation)
    generated = generated_flags(spec.persistence, user)
    require_flags(inspection, generated)
    generation = "g_" + secrets.token_hex(8)
    port, api_key = free_port(), child_api_key()
    argv = launch_args(model_dir, spec.id, port, api_key, generated, user)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.setdefault(KV_SPACE_ENV, _kv_space_gib())
    workdir = WorkDir.create(werk_home() / "backends" / "vllm-runs", generation)
    process = SupervisedProcess.spawn(
        [installation.python, *argv], log_path=workdir.path / "server.log", env=env,
        cwd=workdir.path, name="vllm", guard_group=True,
    )  # fmt: skip
    http = LoopbackClient("127.0.0.1", port, headers={"Authorization": f"Bearer {api_key}"})

    async def ready() -> bool:
        try:
            if (await http.fetch("GET", "/health", timeout=2.0))[0] != 200:
                return False
            return (await http.fetch("GET", "/v1/models", timeout=5.0))[0] == 200
        except LoopbackError:
            return False

    timeout = float(os.environ.get(TIMEOUT_ENV, "300"))
    try:
        await wait_until_ready(process, ready, timeout=timeout, what="vLLM")
    except ProcessExited as exc:
        tail = process.log_tail()
        log.error(
            "vLLM for %s exited with %s during startup; log tail:\n%s", spec.id, exc.code, tail
        )
        process.kill_now()
        await http.aclose()
        workdir.release()
        raise BackendError(f"vLLM exited during startup: {_startup_failure(tail)}") from None
    except BaseException:
        process.kill_now()
        await http.aclose()
        workdir.release()
        raise
    public = tuple(a for a in argv[2:] if a != api_key)
    handle = VllmHandle(
        process=process, workdir=workdir, http=http, args=public,
        installation=installation, inspection=inspection,
    )  # fmt: skip
    LIVE.add(handle)
    runtime = Runtime(
        backend=spec.backend, model=spec, generation=generation, handle=handle, args=public,
        pid=process.pid,
    )  # fmt: skip

    def died(code: int) -> None:
        LIVE.discard(handle)
        if not handle.stopped:
            runtime.alive = False
            log.error(
                "vLLM for %s exited with %s; log tail:\n%s", spec.id, code, process.log_tail(4096)
            )

    process.on_exit(died)
    process.watch()
    log.info(
        "vLLM %s (pid %s, from %s) ready for model %s on port %s",
        inspection.version, process.pid, installation.source, spec.id, port,
    )  # fmt: skip
    return runtime


def check_alive(runtime: Runtime) -> bool:
    handle = runtime.handle
    if isinstance(handle, VllmHandle) and not handle.alive():
        runtime.alive = False
    return runtime.alive


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: stop the whole process group (the engine too), reap, clean."""
    handle = runtime.handle
    runtime.alive = False
    if not isinstance(handle, VllmHandle) or handle.stopped:
        return
    handle.stopped = True
    LIVE.discard(handle)
    await handle.process.terminate(grace=10.0)
    await handle.http.aclose()
    handle.workdir.release()
