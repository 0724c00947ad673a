"""The in-process values of the terminal chat's backend-native KV snapshots (the
``werk_chat_native_cache`` hook): what a provider is given and what it is told after a turn."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from .backends import Runtime

__all__ = ["NativeChatCache", "NativeContext", "NativeDir", "TurnOutcome"]


class NativeDir(Protocol):
    """``native_dir(create)``: the session's private ``native/`` directory (0700, never a
    symbolic link), created when ``create`` is true; ``None`` when it does not exist and
    ``create`` is false."""

    def __call__(self, create: bool) -> Path | None: ...


class NativeContext(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_chat_native_cache` is given once the local runtime is up.

    :ivar runtime: the live local runtime.
    :ivar native_dir: the session's private directory for the provider's files (``werk cache``
        lists and purges it as ``chat:<name>/native``).
    :ivar phase: prints a ``-v`` phase line (runtime inspection, native readiness,
        preparation, restore, ...).
    """

    runtime: Runtime
    native_dir: NativeDir
    phase: Callable[[str], None]


class TurnOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How one terminal-chat turn ended.

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
    messages: Sequence[dict[str, Any]] = msgspec.field(default_factory=tuple)
    reply: str = ""


@runtime_checkable
class NativeChatCache(Protocol):
    """A backend-native KV snapshot provider for one local chat session.

    None of its methods may fail the turn for a cache problem: a snapshot that cannot be
    restored or saved is reported through ``NativeContext.phase`` and the conversation goes on
    from the archive. Cancellation (Ctrl+C) must propagate.
    """

    async def before_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Prepare (and, on the first request, lazily restore); return the body to send."""
        ...

    async def after_response(self, outcome: TurnOutcome) -> None:
        """Save after a complete turn; invalidate or do nothing otherwise."""
        ...

    async def close(self) -> None:
        """Release what the provider holds; called once before the runtime stops."""
        ...
