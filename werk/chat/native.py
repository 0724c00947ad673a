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

A provider keeps its files under the session's ``native/`` directory
(:meth:`werk.chat.archive.ChatArchive.native_dir`), which ``werk cache`` lists as
``chat:<name>/native`` and purges without touching the message archive. Without
``--persistence`` there is no archive, and providers are not consulted.

No provider is bundled yet: :func:`native_providers` returns an empty list, and every session
is "conversation archive only".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..backends import Runtime
from ..plugins import WerkPluginManager
from .archive import ChatArchive

__all__ = [
    "NativeCacheFactory",
    "NativeChatCache",
    "NativeContext",
    "TurnOutcome",
    "native_providers",
]


@dataclass(frozen=True, kw_only=True)
class NativeContext:
    """What a provider is given when the local runtime is up.

    :ivar pm: the plugin manager (for owner-only ``call_operation``).
    :ivar runtime: the live local runtime (its ``backend`` says whether the provider applies).
    :ivar archive: the locked session (its ``native_dir`` is the provider's private place).
    :ivar phase: prints a ``-v`` phase line (runtime inspection, native readiness,
        preparation, restore, ...).
    """

    pm: WerkPluginManager
    runtime: Runtime
    archive: ChatArchive
    phase: Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """How one turn ended.

    :ivar complete: a finish reason arrived and the stream ended cleanly (not cancelled, no
        error). Only then may a snapshot be published or reuse be recorded.
    :ivar finish_reason: the backend's finish reason, if any.
    :ivar usage: the backend's ``usage`` object, if it sent one (cached-token counts live in
        ``usage["prompt_tokens_details"]["cached_tokens"]``).
    :ivar messages: the messages that were sent (system first, the new user message last).
    :ivar reply: the reply text received (partial when not complete).
    """

    complete: bool
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    messages: Sequence[dict[str, Any]] = field(default_factory=tuple)
    reply: str = ""


class NativeChatCache(Protocol):
    """A backend-native KV snapshot provider for one local chat session."""

    async def before_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Prepare (and, on the first request, lazily restore); return the body to send."""
        ...

    async def after_response(self, outcome: TurnOutcome) -> None:
        """Save after a complete turn; invalidate or do nothing otherwise."""
        ...

    async def close(self) -> None:
        """Release what the provider holds; called once before the runtime stops."""
        ...


NativeCacheFactory = Callable[[NativeContext], Awaitable[NativeChatCache | None]]
"""Returns a provider for this runtime, or ``None`` when it does not apply (another backend)."""


def native_providers() -> list[NativeCacheFactory]:
    """The factories the local engine consults, in order; the first non-``None`` wins."""
    return []
