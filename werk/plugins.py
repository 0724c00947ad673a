"""Plugin loading and owner-only hook dispatch.

:func:`get_plugin_manager` builds a fresh :class:`WerkPluginManager`; nothing is loaded at import
time. Plugins come from the ``werk`` entry-point group. ``WERK_LOAD_PLUGINS`` (comma-separated
distribution or entry-point names; empty means none) restricts which ones load. A plugin that
raises on import, implements an unknown hook, or raises during registration becomes a ``failed``
row carrying its error text; the host keeps working. ``WERK_TRACE_PLUGINS=1`` logs every hook
call to the ``werk.plugins`` logger (stderr).
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any, TypeVar

import msgspec
import pluggy

from . import hookspecs
from ._entry_points import entry_points
from .backends import (
    OPERATION_CAPABILITY,
    BackendDescriptor,
    BackendState,
    CapabilityContext,
    DecodeOutcome,
    ExpertMoveOutcome,
    ExpertReport,
    OpenAIReply,
    Operation,
    PrefillOutcome,
    Runtime,
)
from .contract import complete_rows
from .protocol.capabilities import CapabilityReport, CapabilityStatus
from .protocol.errors import BackendError, InvalidRequest, Unsupported, WerkError
from .protocol.info import PluginInfo, PluginStatus

__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginRecord",
    "WerkPluginManager",
    "get_plugin_manager",
]

ENTRY_POINT_GROUP = "werk"
LOAD_ENV = "WERK_LOAD_PLUGINS"
TRACE_ENV = "WERK_TRACE_PLUGINS"

CAPABILITY_TIMEOUT_SECONDS = 10.0
"""How long the server waits for one ``werk_capabilities`` call before reporting the backend's
``<backend>.discovery`` row ``unavailable`` (the call goes on in its worker thread)."""

RESULT_TYPES: dict[Operation, type] = {
    Operation.PREFILL: PrefillOutcome,
    Operation.DECODE: DecodeOutcome,
    Operation.SNAPSHOT: BackendState,
    Operation.RESTORE: BackendState,
    Operation.MOVE_EXPERTS: ExpertMoveOutcome,
    Operation.OBSERVE_EXPERTS: ExpertReport,
    Operation.OPENAI: OpenAIReply,
}
"""What each operation hook must return; anything else is the plugin's ``backend_error``."""

_T = TypeVar("_T")

log = logging.getLogger("werk.plugins")
_warned: set[str] = set()
"""Plugins whose import or registration failure was already logged by this process."""


class PluginRecord(msgspec.Struct):
    """What the host knows about one plugin, loaded or not."""

    name: str
    version: str | None
    status: PluginStatus
    error: str | None = None
    backends: list[str] = msgspec.field(default_factory=list)
    hooks: list[str] = msgspec.field(default_factory=list)
    plugin: object | None = None
    traceback: str | None = None
    """The failure's full traceback (``werk plugins -v`` shows it)."""

    def info(self) -> PluginInfo:
        return PluginInfo(
            name=self.name,
            version=self.version,
            backends=list(self.backends),
            status=self.status,
            error=self.error,
            hooks=list(self.hooks),
        )


def _allowed_names(environ: Mapping[str, str]) -> set[str] | None:
    raw = environ.get(LOAD_ENV)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 500 else text[:497] + "..."


def _warn_once(name: str, what: str, exc: BaseException) -> None:
    """One warning per failed plugin and process; the traceback only when tracing."""
    if name in _warned:
        return
    _warned.add(name)
    log.warning(
        "plugin %s failed to %s: %s (details: werk plugins -v)",
        name,
        what,
        _error_text(exc),
        exc_info=log.isEnabledFor(logging.DEBUG),
    )


async def await_me_maybe(value: Any) -> Any:
    """Await ``value`` if a hook implementation returned an awaitable."""
    if inspect.isawaitable(value):
        return await value
    return value


class WerkPluginManager(pluggy.PluginManager):
    """A pluggy manager that tracks plugin rows and owns the backend registry."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.backends: dict[str, BackendDescriptor] = {}
        self._backend_owner: dict[str, str] = {}
        self._discovery_lock = threading.Lock()
        self._only_callers: dict[tuple[int, str], Callable[..., Any]] = {}
        self._monitored = False
        self._stuck: set[tuple[str, str | None]] = set()
        """(backend, model) whose abandoned discovery is still running in its thread."""

    # -- loading ---------------------------------------------------------------------------

    def load_entrypoints(self, environ: Mapping[str, str] | None = None) -> None:
        """Load every allowed entry point of group ``werk``; failures become ``failed`` rows."""
        env = os.environ if environ is None else environ
        allowed = _allowed_names(env)
        for ep in sorted(entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
            name = ep.dist_name if ep.dist_name is not None else ep.name
            version = ep.dist_version
            if allowed is not None and name not in allowed and ep.name not in allowed:
                continue
            if name in self.records:
                name = f"{name}:{ep.name}"
            try:
                plugin = ep.load()
            except Exception as exc:
                _warn_once(name, "import", exc)
                self.records[name] = PluginRecord(
                    name=name,
                    version=version,
                    status=PluginStatus.FAILED,
                    error=_error_text(exc),
                    traceback="".join(traceback.format_exception(exc)),
                )
                continue
            self.add_plugin(plugin, name=name, version=version)

    def add_plugin(self, plugin: object, *, name: str, version: str | None = None) -> PluginRecord:
        """Register ``plugin``, validate its hooks and collect its backends.

        Any failure unregisters the plugin and records it as ``failed``.
        """
        record = PluginRecord(name=name, version=version, status=PluginStatus.LOADED)
        self.records[name] = record
        try:
            self.register(plugin, name=name)
        except Exception as exc:
            record.status, record.error = PluginStatus.FAILED, _error_text(exc)
            record.traceback = "".join(traceback.format_exception(exc))
            return record
        record.plugin = plugin
        record.hooks = sorted(impl for impl in self._implemented_hooks(plugin))
        try:
            unknown = [h for h in record.hooks if not self._has_spec(h)]
            if unknown:
                raise pluggy.PluginValidationError(plugin, f"unknown hook(s) {', '.join(unknown)}")
            registered: list[BackendDescriptor] = []
            caller = self._only(plugin, "werk_register_backends")
            caller(register=registered.append)
            for descriptor in registered:
                if not isinstance(descriptor, BackendDescriptor):
                    raise TypeError("register() expects a werk.BackendDescriptor")
                owner = self._backend_owner.get(descriptor.name)
                if owner is not None:
                    raise ValueError(
                        f"backend {descriptor.name!r} is already registered by {owner}"
                    )
            for descriptor in registered:
                self.backends[descriptor.name] = descriptor
                self._backend_owner[descriptor.name] = name
                record.backends.append(descriptor.name)
        except Exception as exc:
            _warn_once(name, "register", exc)
            self.unregister(plugin)
            record.status, record.error, record.plugin = PluginStatus.FAILED, _error_text(exc), None
            record.traceback = "".join(traceback.format_exception(exc))
            record.backends = []
        return record

    def _implemented_hooks(self, plugin: object) -> Iterable[str]:
        for hook_name in dir(plugin):
            if hook_name.startswith("werk_") and self.parse_hookimpl_opts(plugin, hook_name):
                yield hook_name

    def _has_spec(self, hook_name: str) -> bool:
        caller = getattr(self.hook, hook_name, None)
        return caller is not None and caller.spec is not None

    def _only(self, plugin: object, hook_name: str) -> Callable[..., Any]:
        """A caller of ``plugin``'s own implementation of ``hook_name`` (keyword arguments, as a
        pluggy hook caller takes them), built once per plugin and hook: ``call_operation`` runs
        per request."""
        key = (id(plugin), hook_name)
        caller = self._only_callers.get(key)
        if caller is None:
            caller = self._only_callers[key] = self._build_only(plugin, hook_name)
        return caller

    def _build_only(self, plugin: object, hook_name: str) -> Callable[..., Any]:
        others = [p for p in self.get_plugins() if p is not plugin]
        subset = self.subset_hook_caller(hook_name, others)
        impls = subset.get_hookimpls()
        first_result = subset.spec is not None and subset.spec.opts.get("firstresult", False)
        if (
            self._monitored
            or not first_result
            or len(impls) != 1
            or impls[0].hookwrapper
            or impls[0].wrapper
        ):
            return subset  # pluggy: tracing monitors, wrappers, result lists
        # A first-result hook (the operations) with one plain implementation: call it as pluggy
        # would (its declared arguments, by position; its result as it is) without pluggy's
        # per-call work (filtering the subset's implementations, the multi-call loop).
        function, argnames = impls[0].function, impls[0].argnames

        def call(**kwargs: Any) -> Any:
            return function(*[kwargs[name] for name in argnames])

        return call

    def register(self, plugin: object, name: str | None = None) -> str | None:
        self._only_callers.clear()
        return super().register(plugin, name)

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        self._only_callers.clear()
        return super().unregister(plugin, name)

    def add_hookcall_monitoring(self, before: Any, after: Any) -> Callable[[], None]:
        self._monitored = True  # every later call goes through pluggy, which runs the monitor
        self._only_callers.clear()
        return super().add_hookcall_monitoring(before, after)

    # -- queries ---------------------------------------------------------------------------

    def plugin_rows(self) -> list[PluginInfo]:
        return [self.records[name].info() for name in sorted(self.records)]

    def owner_of(self, backend: str) -> PluginRecord:
        try:
            return self.records[self._backend_owner[backend]]
        except KeyError:
            raise Unsupported(f"no loaded plugin provides backend {backend!r}") from None

    def implements(self, backend: str, hook_name: str) -> bool:
        record = self.owner_of(backend)
        return hook_name in record.hooks

    def implementers(self, hook_name: str) -> list[tuple[str, object]]:
        """``(plugin name, plugin)`` of every loaded plugin implementing ``hook_name``."""
        caller: pluggy.HookCaller = getattr(self.hook, hook_name)
        return [(self.get_name(i.plugin) or "?", i.plugin) for i in caller.get_hookimpls()]

    def offers(
        self, hook_name: str, item_type: type[_T], key: Callable[[_T], str], what: str
    ) -> dict[str, tuple[str, _T]]:
        """What every plugin offers through the argument-less hook ``hook_name`` (a sequence
        of ``item_type``), by ``key``, with the plugin offering each.

        :raises werk.InvalidRequest: an item of another type, or two items with one key (the
            message names ``what`` and both plugins).
        """
        found: dict[str, tuple[str, _T]] = {}
        for plugin_name, plugin in self.implementers(hook_name):
            for result in self.call_plugin(plugin, hook_name):
                for item in result or ():
                    if not isinstance(item, item_type):
                        raise InvalidRequest(
                            f"plugin {plugin_name} returned a {type(item).__name__} from "
                            f"{hook_name}, not a werk.{item_type.__name__}"
                        )
                    name = key(item)
                    if name in found:
                        raise InvalidRequest(
                            f"{what} {name!r} is offered by {found[name][0]} and {plugin_name}"
                        )
                    found[name] = (plugin_name, item)
        return found

    def call_plugin(self, plugin: object, hook_name: str, **kwargs: Any) -> Any:
        """Call ``hook_name`` on ``plugin`` alone, as pluggy would (argument matching, tracing
        and call monitors apply; see :meth:`_build_only`). Returns what pluggy returns: the list
        of non-``None`` results, or the first one for a ``firstresult`` hook. Exceptions
        propagate unchanged."""
        return self._only(plugin, hook_name)(**kwargs)

    # -- owner-only dispatch ---------------------------------------------------------------

    def capabilities(self, context: CapabilityContext) -> list[CapabilityReport]:
        """Rows from the plugin owning ``context.backend``, completed by the host.

        Blocking: the plugin may inspect executables or files. Servers call
        :meth:`capabilities_bounded` instead. A raising plugin (or one returning something that
        is not a :class:`CapabilityReport`) yields one ``<backend>.discovery`` row
        ``unavailable`` instead of hiding the failure. Whatever the plugin said, rows its
        missing hooks rule out are ``unsupported`` (:func:`werk.contract.complete_rows`).
        """
        record = self.owner_of(context.backend)
        rows: list[CapabilityReport] = []
        if "werk_capabilities" in record.hooks:
            try:
                results = self._only(record.plugin, "werk_capabilities")(context=context)
                rows = [row for result in results if result for row in result]
                for row in rows:
                    if not isinstance(row, CapabilityReport):
                        raise TypeError(f"returned {type(row).__name__}, not a CapabilityReport")
            except Exception as exc:
                log.warning(
                    "capability discovery failed in %s: %s",
                    record.name,
                    _error_text(exc),
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                rows = [
                    self._discovery_row(
                        context, f"capability discovery raised {type(exc).__name__}"
                    )
                ]
        return self._completed(context, record, rows)

    async def capabilities_bounded(
        self, context: CapabilityContext, *, timeout: float = CAPABILITY_TIMEOUT_SECONDS
    ) -> list[CapabilityReport]:
        """:meth:`capabilities` in a worker thread, bounded by ``timeout`` seconds.

        The event loop never runs a plugin's discovery code. A plugin that does not answer in
        time yields an ``unavailable`` ``<backend>.discovery`` row plus the rows its missing
        hooks rule out; its call finishes in the background and is discarded. Until that
        abandoned call has finished, the same (backend, model) is not asked again (the row says
        so at once), so a plugin that hangs costs one thread, not one per request. Calls that
        answer in time may run concurrently, as before.
        """
        import anyio  # imported when used: every `werk` command loads this module

        record = self.owner_of(context.backend)
        key = (context.backend, context.model.id if context.model else None)
        with self._discovery_lock:
            stuck = key in self._stuck
        if stuck:
            reason = "an earlier capability discovery has not finished yet"
            return self._completed(context, record, [self._discovery_row(context, reason)])
        finished = threading.Event()

        def discover() -> list[CapabilityReport]:
            try:
                return self.capabilities(context)
            finally:
                with self._discovery_lock:
                    finished.set()
                    self._stuck.discard(key)

        result: list[CapabilityReport] | None = None
        with anyio.move_on_after(timeout):
            result = await anyio.to_thread.run_sync(discover, abandon_on_cancel=True)
        if result is not None:
            return result
        with self._discovery_lock:
            if not finished.is_set():
                self._stuck.add(key)  # cleared by the abandoned call when it ends
        log.warning("capability discovery in %s took longer than %.1fs", record.name, timeout)
        row = self._discovery_row(
            context, f"capability discovery did not answer within {timeout:g}s"
        )
        return self._completed(context, record, [row])

    def _discovery_row(self, context: CapabilityContext, reason: str) -> CapabilityReport:
        return CapabilityReport(
            id=f"{context.backend}.discovery",
            status=CapabilityStatus.UNAVAILABLE,
            backend=context.backend,
            model=context.model.id if context.model else None,
            reason=reason,
        )

    def _completed(
        self, context: CapabilityContext, record: PluginRecord, rows: list[CapabilityReport]
    ) -> list[CapabilityReport]:
        model_id = context.model.id if context.model else None
        filled = [
            CapabilityReport(
                id=row.id,
                status=row.status,
                backend=row.backend or context.backend,
                model=row.model if row.model is not None else model_id,
                operations=list(row.operations),
                reason=row.reason,
            )
            for row in rows
        ]
        descriptor = self.backends.get(context.backend)
        return complete_rows(
            filled,
            hooks=record.hooks,
            backend=context.backend,
            model=model_id,
            can_start=descriptor is not None and descriptor.start is not None,
            states_in_process=descriptor is not None and descriptor.states_in_process,
        )

    async def call_operation(self, operation: Operation, runtime: Runtime, **kwargs: Any) -> Any:
        """Call ``operation`` on the plugin that owns ``runtime`` only.

        :raises Unsupported: the owner has no implementation, or every implementation declined
            (returned ``None``); the error names the capability.
        :raises BackendError: an implementation raised a non-Werk exception (logged in full).
        """
        cap = OPERATION_CAPABILITY.get(operation)
        capability = cap.value if cap is not None else None
        record = self.owner_of(runtime.backend)
        if operation.value not in record.hooks:
            raise Unsupported(
                f"backend {runtime.backend!r} does not implement {operation.value}",
                capability=capability,
            )
        caller = self._only(record.plugin, operation.value)
        try:
            result = await await_me_maybe(caller(runtime=runtime, **kwargs))
        except WerkError:
            raise
        except Exception:
            log.exception("%s raised in %s", operation.value, record.name)
            raise BackendError(
                f"backend {runtime.backend!r} failed during {operation.value.removeprefix('werk_')}"
            ) from None
        if result is None:
            raise Unsupported(
                f"backend {runtime.backend!r} declined {operation.value}", capability=capability
            )
        expected = RESULT_TYPES[operation]
        if not isinstance(result, expected):
            log.error(
                "plugin %s returned %s from %s, expected %s",
                record.name,
                type(result).__name__,
                operation.value,
                expected.__name__,
            )
            raise BackendError(
                f"plugin {record.name!r} returned {type(result).__name__} from "
                f"{operation.value}, not a werk.{expected.__name__}"
            )
        return result


def _enable_tracing(pm: WerkPluginManager) -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("werk.plugins: %(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG)

    def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        names = ", ".join(pm.get_name(i.plugin) or "?" for i in impls)
        log.debug("call %s(%s) -> [%s]", hook_name, ", ".join(sorted(kwargs)), names)

    def after(outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Any) -> None:
        exc = outcome.exception
        log.debug("done %s%s", hook_name, f" raised {type(exc).__name__}" if exc else "")

    pm.add_hookcall_monitoring(before, after)


def get_plugin_manager(
    *,
    load_entrypoints: bool = True,
    plugins: Iterable[tuple[str, ModuleType | object]] = (),
    environ: Mapping[str, str] | None = None,
) -> WerkPluginManager:
    """Build a plugin manager.

    :param load_entrypoints: load the ``werk`` entry-point group (honours ``WERK_LOAD_PLUGINS``).
    :param plugins: extra ``(name, plugin)`` pairs to register (tests, embedding).
    :param environ: environment to read instead of ``os.environ``.
    """
    env = os.environ if environ is None else environ
    pm = WerkPluginManager()
    if env.get(TRACE_ENV, "") not in ("", "0"):
        _enable_tracing(pm)
    if load_entrypoints:
        pm.load_entrypoints(env)
    for name, plugin in plugins:
        pm.add_plugin(plugin, name=name)
    return pm
