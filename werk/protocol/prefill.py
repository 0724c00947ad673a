"""Prefill and decode shapes (§6)."""

from __future__ import annotations

import enum
from typing import Annotated, Literal

import msgspec

from .base import Request, Response
from .policy import Policy
from .states import StateSummary

__all__ = [
    "MAX_COMPLETION_BYTES",
    "MAX_PROMPT_CHARS",
    "ChatMessage",
    "ChatStateOptions",
    "DecodeRequest",
    "DecodeResponse",
    "DecodeUsage",
    "FinishReason",
    "Handoff",
    "PrefillRequest",
    "PrefillResponse",
    "PrefillUsage",
    "ReuseInfo",
    "ReuseMatch",
    "ReuseOutcome",
]

MAX_COMPLETION_BYTES = 1024 * 1024
"""Backend-returned completion text is bounded to 1 MiB of UTF-8."""
MAX_PROMPT_CHARS = 4 * 1024 * 1024
MAX_MESSAGES = 4096
MAX_STOP_SEQUENCES = 16
MAX_DECODE_TOKENS = 65_536

ModelId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
HandoffToken = Annotated[str, msgspec.Meta(pattern=r"^wh_[A-Za-z0-9_-]{16,128}$")]


class ChatMessage(Request, frozen=True, kw_only=True):
    """One chat message.

    :ivar role: ``system``, ``user``, ``assistant`` or ``tool``.
    :ivar content: its text.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)]


class PrefillRequest(Request, frozen=True, kw_only=True):
    """Exactly one of ``prompt`` / ``messages``.

    ``policy`` and ``allow_experimental`` distinguish *absent* (``msgspec.UNSET``: the server's
    defaults apply) from *present* (the request owns the decision; explicit ``false`` is never
    promoted).
    """

    model: ModelId
    prompt: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)] | None = None
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1, max_length=MAX_MESSAGES)] | (
        None
    ) = None
    policy: Policy | msgspec.UnsetType = msgspec.UNSET
    allow_experimental: bool | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")


class Handoff(Response, frozen=True, kw_only=True):
    """A single-use decode handoff. The token is shown exactly once."""

    token: str
    expires_at: str


class ReuseOutcome(enum.StrEnum):
    REUSED = "reused"
    FRESH = "fresh"
    DISABLED = "disabled"


class ReuseMatch(enum.StrEnum):
    EXACT = "exact"
    """The state's prompt is this prompt."""
    PREFIX = "prefix"
    """The state's prompt shares a prefix with this one: it was continued."""


class ReuseInfo(Response, frozen=True, kw_only=True):
    """How a prefill reused a named state. ``state_id`` is the state reused (with ``match:
    prefix``, the one continued; the prefill then keeps a new state for its own prompt);
    ``restored_tokens`` how many tokens the backend restored from it (when it restored one)."""

    outcome: ReuseOutcome
    state_id: str | None = None
    match: ReuseMatch | None = None
    restored_tokens: int | None = None


class PrefillUsage(Response, frozen=True, kw_only=True):
    """``cached_tokens``: prompt tokens the backend reported as reused; ``evaluated_tokens``:
    the ones it computed (``prompt_tokens - cached_tokens``, when it reports reuse)."""

    prompt_tokens: int
    cached_tokens: int | None = None
    evaluated_tokens: int | None = None


class PrefillResponse(Response, frozen=True, kw_only=True):
    state: StateSummary | None
    handoff: Handoff
    reuse: ReuseInfo
    usage: PrefillUsage


class ChatStateOptions(Request, frozen=True, kw_only=True):
    """The ``werk`` member of a ``POST /v1/chat/completions`` body (an addition).

    :ivar persist: run the turn as a prefill that keeps a named disk state of the conversation
        (continuing the longest saved prefix of it) and a decode, then keep the conversation
        with the reply as its state; the next turn continues from it, and the state of the
        turn it continued is deleted (superseded).
    :ivar allow_experimental: the opt-in that the backend's ``experimental`` state rows need
        (default: the server's ``--persistence`` default, else false).
    """

    persist: bool = False
    allow_experimental: bool | msgspec.UnsetType = msgspec.UNSET


class DecodeRequest(Request, frozen=True, kw_only=True):
    handoff: HandoffToken
    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_DECODE_TOKENS)] = 64
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] = 0.0
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    stop: Annotated[
        list[Annotated[str, msgspec.Meta(min_length=1, max_length=256)]],
        msgspec.Meta(max_length=MAX_STOP_SEQUENCES),
    ] = msgspec.field(default_factory=list)


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"


class DecodeUsage(Response, frozen=True, kw_only=True):
    completion_tokens: int


class DecodeResponse(Response, frozen=True, kw_only=True):
    text: str
    finish_reason: FinishReason
    usage: DecodeUsage
    state: StateSummary | None = None
    handoff: Handoff | None = None
