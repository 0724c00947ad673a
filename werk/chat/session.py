"""One conversation and one turn of it, independent of where the model runs.

A :class:`ChatEngine` is where requests go: :class:`werk.chat.local.LocalEngine` (a runtime
this process started) or :class:`werk.chat.remote.RemoteEngine` (a running ``werk serve``).
A :class:`Conversation` is the history (optionally backed by a locked
:class:`~werk.chat.archive.ChatArchive`). :func:`run_turn` sends the whole history plus the
new user message, streams the reply to a callback, and only when the reply is complete appends
the turn and saves the archive. A cancelled (Ctrl+C) or failed reply leaves the history as it
was: the user message is not kept either, so a resumed conversation never contains a question
without its answer.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

from ..protocol import BackendError
from .archive import ChatArchive, Message
from .native import TurnOutcome
from .stream import ReplyAccumulator, cached_tokens

__all__ = ["ChatEngine", "Conversation", "Sampling", "TurnResult", "run_turn"]


class ChatEngine(Protocol):
    """Where chat requests go."""

    label: str

    def stream(self, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """Send one streaming chat-completion request; yield its chunk objects as they come.

        Closing the iterator early cancels the request and closes the backend's stream.
        """
        ...

    def finished(self, outcome: TurnOutcome) -> None:
        """Told after every turn, complete or not (native snapshot providers hang off this)."""
        ...

    def close(self) -> None:
        """Release everything (a local engine stops and reaps its runtime)."""
        ...


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Per-request sampling options; ``None`` leaves the backend's default."""

    temperature: float | None = None
    seed: int | None = None
    max_tokens: int | None = None

    def apply(self, body: dict[str, Any]) -> None:
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.seed is not None:
            body["seed"] = self.seed
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens


class Conversation:
    """The history of one chat: an optional system prompt and completed user/assistant turns.

    :param model: the model id requests name.
    :param system: the system prompt, or ``None``.
    :param archive: when given, the history starts from it and every change is saved to it.
    """

    def __init__(
        self, model: str, *, system: str | None = None, archive: ChatArchive | None = None
    ) -> None:
        self.model = model
        self.archive = archive
        self.system = system
        self.messages: list[Message] = []
        if archive is not None:
            self.system = archive.record.system
            self.messages = archive.messages
            if archive.system_replaced:
                self._save()

    def request_messages(self, user_text: str) -> list[dict[str, Any]]:
        """The OpenAI ``messages`` for the next turn: system, history, the new message."""
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        out.extend({"role": m.role, "content": m.content} for m in self.messages)
        out.append({"role": "user", "content": user_text})
        return out

    def commit(self, user_text: str, reply: str) -> None:
        """Append a completed turn (and save it atomically when archived)."""
        self.messages += [
            Message(role="user", content=user_text),
            Message(role="assistant", content=reply),
        ]
        try:
            self._save()
        except BaseException:
            del self.messages[-2:]
            raise

    def reset(self) -> None:
        """Forget every turn (the system prompt stays); saved when archived."""
        previous, self.messages = self.messages, []
        try:
            self._save()
        except BaseException:
            self.messages = previous
            raise

    def _save(self) -> None:
        if self.archive is not None:
            self.archive.save(self.messages, system=self.system)


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """A completed turn: the reply text, why it ended, usage, and the full response object."""

    text: str
    finish_reason: str
    usage: dict[str, Any] | None
    response: dict[str, Any]


def run_turn(
    engine: ChatEngine,
    conversation: Conversation,
    user_text: str,
    *,
    sampling: Sampling,
    on_text: Callable[[str], None],
    phase: Callable[[str], None],
) -> TurnResult:
    """Send one turn and stream its reply to ``on_text``.

    The turn is added to the conversation (and saved) only when the reply completed; the
    engine is told the outcome afterwards, so a native snapshot is published only for a turn
    that the archive holds.

    :raises werk.WerkError: the request failed or the reply ended without a finish reason
        (nothing is kept).
    :raises KeyboardInterrupt: the reply was cancelled; the stream is closed first.
    """
    messages = conversation.request_messages(user_text)
    body: dict[str, Any] = {
        "model": conversation.model,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sampling.apply(body)
    reply = ReplyAccumulator(conversation.model)
    complete = False
    phase(f"request: {len(messages)} message(s) to {engine.label}")
    stream = engine.stream(body)
    try:
        first = True
        for chunk in stream:
            piece = reply.feed(chunk)
            if piece:
                if first:
                    phase("first token received")
                    first = False
                on_text(piece)
        if reply.finish_reason is None:
            raise BackendError("the reply ended without a finish reason; nothing was kept")
        stream.close()
        usage = reply.usage or {}
        cached = cached_tokens(reply.usage)
        phase(
            f"reply complete: finish_reason {reply.finish_reason}; usage prompt "
            f"{usage.get('prompt_tokens', '?')}, completion {usage.get('completion_tokens', '?')}"
            + (f", cached {cached} (reported by the backend)" if cached is not None else "")
        )
        conversation.commit(user_text, reply.text)
        complete = True
    finally:
        stream.close()
        engine.finished(
            TurnOutcome(
                complete=complete,
                finish_reason=reply.finish_reason,
                usage=reply.usage,
                messages=messages,
                reply=reply.text,
            )
        )
    assert reply.finish_reason is not None
    return TurnResult(
        text=reply.text,
        finish_reason=reply.finish_reason,
        usage=reply.usage,
        response=reply.response(),
    )
