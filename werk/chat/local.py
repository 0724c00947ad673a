"""The in-process route: start the model's runtime here, talk to it, stop and reap it at exit.

:class:`LocalEngine` resolves ``MODEL`` through the model registry, starts a runtime through
the backend's own ``BackendDescriptor.start`` (as ``werk serve``'s ``RuntimeManager`` does) and
sends every turn as ``OpenAICall(route="chat.completions", stream=True)`` through the plugin
manager's owner-only ``call_operation(Operation.OPENAI, …)``.

Backends are ``async``; the CLI is a plain blocking program (readline, signals). So the engine
runs one private event loop in a background thread (an anyio blocking portal) and the main
thread only waits on it. Every wait is interruptible: Ctrl+C (``KeyboardInterrupt``) or
SIGTERM/SIGHUP (:class:`werk.chat.signals.Terminated`) raise in the main thread, the work in
the loop is cancelled, and the main thread waits (with further signals deferred) until that
task has really ended before going on. :meth:`LocalEngine.close` — always reached through
``with`` — stops the runtime through ``BackendDescriptor.stop``, which must reap every process
the runtime owns, then ends the loop. A start that is interrupted is cancelled; if it managed
to return a runtime anyway, that runtime is stopped too.

A runtime found dead between turns is stopped and a new one started for the next turn.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ..backends import BackendDescriptor, ModelSpec, OpenAICall, OpenAIReply, Operation, Runtime
from ..memory.filecache import ModelFileLease, cache_release_enabled
from ..models import ModelRegistry
from ..plugins import WerkPluginManager, get_plugin_manager
from ..protocol import BackendError, CapabilityId, PayloadTooLarge, Unavailable, WerkError
from .archive import ChatArchive
from .native import NativeCacheFactory, NativeChatCache, NativeContext, TurnOutcome
from .render import WaitIndicator
from .signals import signals_deferred

__all__ = ["MAX_CHUNK_BYTES", "LocalEngine"]

log = logging.getLogger("werk.chat")

MAX_CHUNK_BYTES = 4 * 1024 * 1024
"""One streamed chunk larger than this is refused (``payload_too_large``)."""

_T = TypeVar("_T")
_END = object()


class LocalEngine:
    """A runtime of ``model_id`` owned by this process (use it as a context manager).

    :param home: the ``WERK_HOME`` whose model registry names the model.
    :param model_id: the imported model id.
    :param phase: prints a ``-v`` phase line.
    :param archive: the locked session, when ``--persistence`` is on (offered to native
        snapshot providers).
    :param providers: native snapshot factories (default: none).
    :param pm: a plugin manager (default: the installed plugins).
    """

    def __init__(
        self,
        home: Path,
        model_id: str,
        *,
        phase: Callable[[str], None],
        archive: ChatArchive | None = None,
        providers: list[NativeCacheFactory] | None = None,
        pm: WerkPluginManager | None = None,
    ) -> None:
        self.home = home
        self.model_id = model_id
        self.label = f"local runtime of {model_id}"
        self._phase = phase
        self._archive = archive
        self._providers = list(providers or [])
        self._pm = pm
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None
        self._descriptor: BackendDescriptor | None = None
        self._spec: ModelSpec | None = None
        self._runtime: Runtime | None = None
        self._lease: ModelFileLease | None = None
        self._cache_release = False
        self._native: NativeChatCache | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LocalEngine:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def runtime(self) -> Runtime | None:
        return self._runtime

    def start(self) -> None:
        """Resolve the model, start the event loop and the runtime, find a native provider."""
        registry = ModelRegistry(self.home)
        manifest = registry.get(self.model_id)
        registry.verify_unchanged(manifest)
        spec = manifest.spec()
        self._phase(f"model {spec.id}: backend {spec.backend}, identity {spec.identity[:23]}…")
        pm = self._pm if self._pm is not None else get_plugin_manager()
        self._pm = pm
        descriptor = pm.backends.get(spec.backend)
        if descriptor is None:
            raise Unavailable(f"no loaded plugin provides backend {spec.backend!r}")
        if descriptor.start is None:
            raise Unavailable(
                f"backend {spec.backend!r} cannot start a runtime on this machine",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        self._descriptor, self._spec = descriptor, spec
        self._cache_release = cache_release_enabled()  # a bad value fails before any start
        self._portal = self._stack.enter_context(start_blocking_portal("asyncio"))
        self._start_runtime()
        self._phase("cache capability probe: skipped; reuse checked on actual requests")
        self._native = self._find_native()

    def _start_runtime(self) -> None:
        descriptor, spec = self._descriptor, self._spec
        assert descriptor is not None and descriptor.start is not None and spec is not None
        start = descriptor.start_runtime
        self._phase(f"runtime: starting {spec.backend} for {spec.id}")

        self._lease = ModelFileLease.acquire(spec.files)

        async def started() -> None:
            try:
                self._runtime = await start(spec)
            except WerkError:
                raise
            except Exception as exc:
                log.debug("starting %s failed", spec.backend, exc_info=True)
                raise Unavailable(
                    f"backend {spec.backend!r} could not start model {spec.id!r} "
                    f"({type(exc).__name__})",
                    capability=CapabilityId.MODEL_RESIDENCY,
                ) from None

        with WaitIndicator()(f"loading {spec.id} ({spec.backend})…"):
            self._call(started)
        assert self._runtime is not None
        self._phase(f"runtime: ready, generation {self._runtime.generation}")

    def _find_native(self) -> NativeChatCache | None:
        runtime, archive, pm = self._runtime, self._archive, self._pm
        assert runtime is not None and pm is not None
        if archive is None:
            self._phase("native KV snapshots: off (no --persistence)")
            return None
        context = NativeContext(
            runtime=runtime,
            native_dir=lambda create: archive.native_dir(create=create),
            phase=self._phase,
        )
        for factory in self._providers:

            async def make(factory: NativeCacheFactory = factory) -> NativeChatCache | None:
                return await factory(pm, context)

            native = self._call(make)
            if native is not None:
                return native
        self._phase(
            f"native KV snapshots: none for backend {runtime.backend}; "
            "the conversation archive is resent on resume"
        )
        return None

    def close(self) -> None:
        """Stop and reap the runtime (signals deferred until it is done), end the loop."""
        with signals_deferred():
            try:
                self._stop_runtime()
            finally:
                self._stack.close()
                self._portal = None

    def _stop_runtime(self) -> None:
        portal, runtime, descriptor = self._portal, self._runtime, self._descriptor
        native, self._native = self._native, None
        if portal is None:
            return
        if native is not None:
            try:
                portal.call(native.close)
            except Exception:
                log.exception("closing the native chat cache failed")
        stopped = False
        try:
            if runtime is None or descriptor is None or descriptor.stop is None:
                return
            self._runtime = None
            self._phase(f"runtime: stopping generation {runtime.generation}")
            try:
                portal.call(descriptor.stop_runtime, runtime)
                stopped = True
            except Exception:
                log.exception("stopping the %s runtime failed", runtime.backend)
            runtime.alive = False
            self._phase("runtime: stopped")
        finally:
            self._end_lease(stopped=stopped or runtime is None)

    def _end_lease(self, *, stopped: bool) -> None:
        """After the runtime is gone: end the model file leases and, when release is on
        (``WERK_MODEL_CACHE_RELEASE``), release the files' page cache."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        drop = stopped and self._cache_release
        results = lease.release(drop_cache=drop)
        if drop:
            released = sum(1 for r in results if r.outcome == "released")
            self._phase(f"model file cache: released for {released} of {len(results)} file(s)")

    # -- waiting on the loop -------------------------------------------------------------------

    def _call(self, fn: Callable[[], Awaitable[_T]]) -> _T:
        """Run ``fn`` in the loop and wait; on an interruption cancel it and wait for its end."""
        portal = self._portal
        assert portal is not None
        done = threading.Event()

        async def wrapper() -> _T:
            try:
                return await fn()
            finally:
                done.set()

        future = portal.start_task_soon(wrapper)
        try:
            return future.result()
        except BaseException:
            if not done.is_set():
                future.cancel()
                with signals_deferred():
                    done.wait()
            raise

    # -- requests ------------------------------------------------------------------------------

    def _live_runtime(self) -> Runtime:
        runtime = self._runtime
        if runtime is not None and runtime.alive:
            return runtime
        self._phase("runtime: found dead; starting a new one")
        self._stop_runtime()
        self._start_runtime()
        self._native = self._find_native()
        assert self._runtime is not None
        return self._runtime

    def stream(self, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """Send ``body`` through ``werk_openai`` and yield its chunk objects as they arrive."""
        runtime = self._live_runtime()
        pm, portal, native = self._pm, self._portal, self._native
        assert pm is not None and portal is not None
        items: queue.SimpleQueue[object] = queue.SimpleQueue()
        done = threading.Event()

        async def produce() -> None:
            reply: OpenAIReply | None = None
            try:
                sent = await native.before_request(body) if native is not None else body
                call = OpenAICall(route="chat.completions", body=sent, stream=True)
                reply = await pm.call_operation(Operation.OPENAI, runtime, call=call)
                if reply.body is not None:
                    items.put(reply.body)
                    return
                assert reply.stream is not None
                async for payload in reply.stream:
                    items.put(payload)
            except WerkError as exc:
                items.put(exc)
            except Exception:
                log.exception("the streamed reply of backend %r failed", runtime.backend)
                items.put(BackendError(f"backend {runtime.backend!r} failed during openai"))
            finally:
                if reply is not None and reply.stream is not None:
                    aclose = getattr(reply.stream, "aclose", None)
                    if aclose is not None:
                        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                            await aclose()
                items.put(_END)
                done.set()

        future = portal.start_task_soon(produce)
        try:
            while True:
                item = items.get()
                if item is _END:
                    return
                if isinstance(item, WerkError):
                    raise item
                yield _as_object(item)
        finally:
            if not done.is_set():
                future.cancel()
                with signals_deferred():
                    done.wait()

    def finished(self, outcome: TurnOutcome) -> None:
        """Tell the native provider (if any) how the turn ended."""
        native = self._native
        if native is None or self._portal is None:
            return

        async def tell() -> None:
            await native.after_response(outcome)

        self._call(tell)


def _as_object(item: object) -> dict[str, Any]:
    """A streamed payload (JSON bytes) or a complete body, as a JSON object."""
    if isinstance(item, dict):
        return item
    if not isinstance(item, bytes | bytearray):
        raise BackendError("the backend streamed something that is not JSON bytes")
    if len(item) > MAX_CHUNK_BYTES:
        raise PayloadTooLarge(f"a streamed chunk is larger than {MAX_CHUNK_BYTES} bytes")
    try:
        obj = json.loads(item)
    except (ValueError, UnicodeDecodeError):
        raise BackendError("the backend streamed a chunk that is not JSON") from None
    if not isinstance(obj, dict):
        raise BackendError("the backend streamed a chunk that is not a JSON object")
    return obj
