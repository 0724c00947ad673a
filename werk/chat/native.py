"""The seam for backend-native chat KV snapshots (opportunistic, local route only).

The conversation archive (:mod:`werk.chat.archive`) is backend-independent text. A backend that
can save and restore its own KV state for a chat (the llama.cpp slot snapshots of the seed's
"Local llama.cpp startup and lazy restore validation") plugs in here as a
:class:`NativeChatCache`, created by a :data:`NativeCacheFactory` once the local runtime is up.
The local engine (:class:`werk.chat.local.LocalEngine`) then calls it around every real request:

1. :meth:`NativeChatCache.before_request` with the request body, before the body reaches
   ``werk_openai``. This is where a snapshot is verified and restored lazily, on the first real
   request only, and where the body may be adjusted (for example pinning a slot). It must never
   run a synthetic prompt of its own.
2. :meth:`NativeChatCache.after_response` with a :class:`TurnOutcome` after every turn,
   complete or not: only a ``complete`` outcome may publish a snapshot or record observed
   reuse; an incomplete or failed one must not.
3. :meth:`NativeChatCache.close` once, before the runtime is stopped.

A provider keeps its files under the session's ``native/`` directory (``NativeContext.native_dir``,
i.e. :meth:`werk.chat.archive.ChatArchive.native_dir`), which ``werk cache`` lists as
``chat:<name>/native`` and purges without touching the message archive. Without
``--persistence`` there is no archive, and providers are not consulted.

Providers come from plugins: :func:`native_providers` returns :func:`plugin_native_cache`, which
asks the plugin that owns the runtime's backend (and only that plugin) through the
:func:`werk.hookspecs.werk_chat_native_cache` hook. A backend whose plugin does not implement
the hook, declines (returns ``None``) or fails is "conversation archive only" for that session;
a failing provider is reported and never fails the chat.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ..native_chat import NativeChatCache, NativeContext, TurnOutcome
from ..plugins import WerkPluginManager, await_me_maybe
from ..protocol import Unsupported, WerkError

__all__ = [
    "NATIVE_CACHE_HOOK",
    "NativeCacheFactory",
    "NativeChatCache",
    "NativeContext",
    "TurnOutcome",
    "native_providers",
    "plugin_native_cache",
]

log = logging.getLogger("werk.chat")

NATIVE_CACHE_HOOK = "werk_chat_native_cache"
"""The hook :func:`plugin_native_cache` calls on the backend's owning plugin."""


NativeCacheFactory = Callable[[WerkPluginManager, NativeContext], Awaitable[NativeChatCache | None]]
"""Returns a provider for this runtime, or ``None`` when it does not apply (another backend)."""


async def plugin_native_cache(
    pm: WerkPluginManager, context: NativeContext
) -> NativeChatCache | None:
    """Ask the plugin that owns ``context.runtime``'s backend for a provider.

    Calls :func:`werk.hookspecs.werk_chat_native_cache` on that plugin only (never on another
    plugin, even one that implements the hook). A plugin without the hook, or one that
    declines, gives ``None``. A plugin that raises, or returns something that is not a
    :class:`NativeChatCache`, is reported as a ``-v`` phase (and a warning in the log) and gives
    ``None``: native snapshots are opportunistic, the chat itself must not fail for them.
    """
    runtime = context.runtime
    try:
        record = pm.owner_of(runtime.backend)
    except Unsupported:
        return None
    if record.plugin is None or NATIVE_CACHE_HOOK not in record.hooks:
        return None
    try:
        result = await await_me_maybe(
            pm.call_plugin(record.plugin, NATIVE_CACHE_HOOK, runtime=runtime, context=context)
        )
    except WerkError as exc:
        context.phase(f"native KV snapshots: unavailable ({exc.message})")
        return None
    except Exception as exc:
        log.warning("%s raised in %s: %s", NATIVE_CACHE_HOOK, record.name, type(exc).__name__)
        log.debug("%s failed", NATIVE_CACHE_HOOK, exc_info=True)
        context.phase(
            f"native KV snapshots: off (the {record.name} provider failed: {type(exc).__name__})"
        )
        return None
    if result is None:
        return None
    if not isinstance(result, NativeChatCache):
        log.warning("%s of %s returned %s", NATIVE_CACHE_HOOK, record.name, type(result).__name__)
        context.phase(f"native KV snapshots: off (the {record.name} provider is malformed)")
        return None
    return result


def native_providers() -> list[NativeCacheFactory]:
    """The factories the local engine consults, in order; the first non-``None`` wins."""
    return [plugin_native_cache]
