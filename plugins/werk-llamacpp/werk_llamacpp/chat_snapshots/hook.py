"""``werk_chat_native_cache``: whether native chat snapshots can be trusted for a runtime, and
the :class:`~.cache.LlamaChatCache` that provides them when they can."""

from __future__ import annotations

import asyncio
import time

import anyio

from werk import NativeChatCache, NativeContext, Runtime

from ..handle import ProbeStatus
from ..process import ManagedHandle, check_alive
from ..slots import allocator_for
from .cache import LlamaChatCache, seconds
from .files import Unsafe, describe
from .identity import Disabled, compute_namespace

__all__ = ["open_chat_cache"]


async def open_chat_cache(runtime: Runtime, context: NativeContext) -> NativeChatCache | None:
    """``werk_chat_native_cache``: a :class:`LlamaChatCache`, or ``None`` (with the reason as a
    ``-v`` phase) when native snapshots cannot be trusted for this runtime.

    Runs after native readiness: the executable's inspection (``--help``, ``--version`` and its
    SHA-256, in parallel, before the spawn) and its re-verification after readiness were done by
    the process layer; only now are the libraries hashed and the session's files read.
    """
    handle = runtime.handle
    phase = context.phase
    if not isinstance(handle, ManagedHandle) or not check_alive(runtime):
        return None
    if handle.early_probe is not None:
        # The state probe started early (an earlier generation left a canary) takes the state
        # slot while it runs and retires it after: reserve the slot for this chat only then.
        await asyncio.wait({handle.early_probe})
    inspection = handle.inspection
    phase(
        f"runtime inspection: llama-server {inspection.version}, sha256 {inspection.sha256[:12]}…"
        " (--help, --version and the hash ran in parallel before the spawn)"
    )
    reason: str | None = None
    if not inspection.valid:
        reason = "the runtime inspection is invalid: " + "; ".join(inspection.problems)
    elif not handle.state_slots or handle.probe.status is ProbeStatus.FAILED:
        reason = (
            handle.probe.reason
            if handle.probe.status is ProbeStatus.FAILED
            else ("the runtime has no state slot")
        )
    if reason is not None:
        phase(f"native KV snapshots: unavailable ({reason})")
        return None
    phase(
        f"native readiness: pid {handle.pid}, generation {handle.generation}; the executable "
        "was re-verified after readiness (identity and full SHA-256)"
    )
    start = time.monotonic()
    phase("preparation: cache file work was deferred until native startup completed")
    try:
        namespace, n_libraries = await anyio.to_thread.run_sync(compute_namespace, runtime, handle)
    except Disabled as exc:
        phase(f"native KV snapshots: unavailable ({exc})")
        return None
    async with handle.slot_lock:
        slot, epoch = allocator_for(handle).acquire()
    cache = LlamaChatCache(
        runtime=runtime,
        handle=handle,
        context=context,
        namespace=namespace,
        slot=slot,
        epoch=epoch,
    )
    phase(
        f"preparation: {n_libraries} runtime libraries hashed, namespace ready, state slot "
        f"{slot} reserved for this chat in {seconds(start)}"
    )
    try:
        await anyio.to_thread.run_sync(cache.load)
    except (Unsafe, OSError) as exc:
        await cache.close()
        phase(f"native KV snapshots: unavailable (the native directory is unsafe: {describe(exc)})")
        return None
    except BaseException:
        await cache.close()
        raise
    return cache
