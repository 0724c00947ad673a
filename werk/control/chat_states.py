"""Persisted chat turns: a ``/v1`` chat that keeps its conversation as a named state.

A ``POST /v1/chat/completions`` whose body carries ``"werk": {"persist": true}``
(:class:`~werk.protocol.ChatStateOptions`) is not relayed to the backend's own ``/v1``: it
runs as a prefill of the messages with ``reuse: prefer`` — which continues the caller's saved
state sharing the longest prefix with the conversation (the previous turn's,
:mod:`werk.control.continuation`) — and a decode of the reply. Then the messages *with the
reply* are kept as the conversation's disk state, continuing the live state the reply was
decoded from (:meth:`~werk.control.prefill.PrefillFlow.keep_continuation`: on llama.cpp the
slot already holds the reply, so almost nothing is evaluated), and the next turn evaluates only
its own new message.

Where the backend has proven prefix continuation (``runtime.state.restore.prefix``) before the
turn, the turn's prefill keeps nothing (``retention: ephemeral``): the state with the reply is
the turn's one disk write, made after the reply. Before that proof (a runtime's first turn) the
prefill keeps the prompt as a disk state too, and the state with the reply then replaces it.
When the reply cannot be kept (the backend no longer holds the turn's state, or keeping it
failed, logged), the conversation's state stays the turn's prompt state where one was kept,
else the state the turn continued. On the same process generation the next turn continues the
live state the conversation's state was written from, where the backend still holds it
(:mod:`werk.control.live_kept`), instead of restoring the disk copy. A state kept by a
persisted turn is deleted (unless pinned) once a turn that extends its *whole* conversation
keeps a newer one, so a conversation holds one state, not one per turn; a turn that shares only
part of it (another conversation with the same system prompt, a regenerated or edited reply)
may continue it but leaves it. A state the caller saved otherwise (a shared system prompt, say)
is continued but never deleted.

A streamed turn (:mod:`werk.http.persisted_chat`) hands the reply on as the backend generates
it (``on_text``, ``DecodeCall.on_text``). The answer is OpenAI's ``chat.completion`` object
(``system_fingerprint``: the runtime's process generation) with a ``werk`` member:
``state_id`` (the conversation's state now) and ``state_tokens`` (the tokens it holds),
``reuse`` (as the turn's prefill's), ``evaluated_tokens`` (of the turn's prompt) and
``superseded`` (the ids of earlier turns' states deleted). Only the fields a prefill and a
decode can honour are accepted: ``model``, ``messages`` (``system``/``user``/``assistant``/
``tool`` with text content), ``max_tokens`` (or ``max_completion_tokens``), ``temperature``,
``seed``, ``stop``, ``stream`` and ``werk`` — and, as client libraries send them, ``n`` (1 only),
``stream_options`` (``include_usage`` only) and ``user`` (a string, not used); any other field
or value is refused (``400``, naming it) rather than silently ignored.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from ..backends import PrefillOutcome
from ..protocol import (
    ChatMessage,
    ChatStateOptions,
    DecodeRequest,
    InvalidRequest,
    NotFound,
    Policy,
    PrefillRequest,
    PruneRequest,
    Retention,
    Reuse,
    ReuseMatch,
    StateSummary,
    WerkError,
)
from .context import ServiceContext
from .continuation import prefix_proven
from .prefill import DecodedTurn, PrefillFlow
from .states import SkipReasonLookup

__all__ = ["ACCEPTED_FIELDS", "DEFAULT_MAX_TOKENS", "PersistedChats", "chat_state_options"]

log = logging.getLogger("werk.control")

ACCEPTED_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "user",
        "werk",
    }
)
DEFAULT_MAX_TOKENS = 256
"""The reply's bound when the request gives none."""
_DEFAULT_TEMPERATURE = 1.0  # OpenAI's default


def chat_state_options(body: dict[str, Any]) -> ChatStateOptions | None:
    """The request's ``werk`` member, decoded (``None`` without one).

    :raises InvalidRequest: a malformed member (unknown fields included)."""
    raw = body.get("werk")
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, ChatStateOptions)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"'werk': {exc}", param="werk") from None


def _messages(body: dict[str, Any]) -> list[ChatMessage]:
    raw = body.get("messages")
    try:
        return msgspec.convert(raw, list[ChatMessage])
    except msgspec.ValidationError as exc:
        raise InvalidRequest(
            f"with werk.persist, messages must be text messages: {exc}", param="messages"
        ) from None


def _check_harmless(body: dict[str, Any]) -> None:
    """OpenAI fields a client library may send as a matter of course, accepted where they ask
    for nothing a turn does not do anyway: ``n`` 1, ``stream_options.include_usage`` (the last
    chunk always carries ``usage``), ``user`` (a string, not used)."""
    if "n" in body and (body["n"] != 1 or isinstance(body["n"], bool)):
        raise InvalidRequest("with werk.persist, 'n' must be 1 (one reply per turn)", param="n")
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict)
        or not all(key == "include_usage" and isinstance(v, bool) for key, v in options.items())
    ):
        raise InvalidRequest(
            "with werk.persist, 'stream_options' may only carry include_usage (true or false)",
            param="stream_options",
        )
    if "user" in body and not isinstance(body["user"], str):
        raise InvalidRequest("'user' must be a string", param="user")


def _decode_request(body: dict[str, Any], handoff: str) -> DecodeRequest:
    fields: dict[str, Any] = {"handoff": handoff}
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    fields["max_tokens"] = DEFAULT_MAX_TOKENS if limit is None else limit
    temperature = body.get("temperature")
    fields["temperature"] = _DEFAULT_TEMPERATURE if temperature is None else temperature
    if body.get("seed") is not None:
        fields["seed"] = body["seed"]
    stop = body.get("stop")
    if stop is not None:
        fields["stop"] = [stop] if isinstance(stop, str) else stop
    try:
        return msgspec.convert(fields, DecodeRequest)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"with werk.persist: {exc}") from None


class PersistedChats:
    """The persisted-turn side of :class:`~werk.control.service.LocalControlService`."""

    def __init__(self, service: ServiceContext, flow: PrefillFlow) -> None:
        self._service = service
        self._flow = flow

    async def complete(
        self,
        principal: str,
        body: dict[str, Any],
        options: ChatStateOptions,
        *,
        on_text: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """One persisted turn (see the module docstring); the ``chat.completion`` object.
        ``on_text``: awaited with the reply's text as it is generated (a streamed turn)."""
        unknown = sorted(set(body) - ACCEPTED_FIELDS)
        if unknown:
            raise InvalidRequest(
                f"'{unknown[0]}' is not supported with werk.persist (accepted: "
                f"{', '.join(sorted(ACCEPTED_FIELDS))})",
                param=unknown[0],
            )
        _check_harmless(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string", param="model")
        defaults = self._service.config.persistence_defaults
        allow = options.allow_experimental
        if isinstance(allow, msgspec.UnsetType):
            allow = defaults.allow_experimental if defaults is not None else False
        policy = Policy(
            retention=Retention.DISK,
            reuse=Reuse.PREFER,
            ttl_seconds=defaults.ttl_seconds if defaults is not None else None,
        )
        conversation = PrefillRequest(
            model=model, messages=_messages(body), policy=policy, allow_experimental=allow
        )
        decode_with = _decode_request(body, "wh_" + "0" * 16)  # checked before backend work
        # Where the reply will be kept by continuing the decoded state, the turn's prompt need
        # not be written to disk first: one state per turn, and no disk write before the reply.
        keep_prompt = not await self._continues_live(model, allow)
        turn_prefill = (
            conversation
            if keep_prompt
            else msgspec.structs.replace(
                conversation, policy=Policy(retention=Retention.EPHEMERAL, reuse=Reuse.PREFER)
            )
        )
        kept = await self._flow.prefill(principal, turn_prefill, origin="chat")
        turn = await self._flow.decode_turn(
            principal,
            msgspec.structs.replace(decode_with, handoff=kept.handoff.token),
            continues=True,
            on_text=on_text,
        )
        reply = turn.response
        with_reply = await self._keep_turn(
            principal, conversation, reply.text, turn, prompt_kept=kept.state is not None
        )
        prompt_state = kept.state.id if kept.state is not None else None
        continued = kept.reuse.state_id
        state_id: str | None
        state_tokens: int | None
        if with_reply is not None:
            state_id, state_tokens = with_reply[0].id, with_reply[1].prompt_tokens
        elif prompt_state is not None:
            state_id, state_tokens = prompt_state, kept.usage.prompt_tokens
        else:  # nothing kept for this turn: the conversation's state is still the continued one
            state_id, state_tokens = continued, kept.reuse.restored_tokens
        superseded: list[str] = []
        prefix = kept.reuse.match is ReuseMatch.PREFIX
        if prefix and continued is not None and state_id != continued:  # a newer one is kept
            superseded = await self._supersede(principal, continued, grown=conversation)
        if prompt_state is not None and state_id != prompt_state:
            deleted = await self._supersede(principal, prompt_state)
            if kept.reuse.match is ReuseMatch.EXACT:  # listed when it existed before the turn
                superseded += deleted
        usage = kept.usage
        runtime = self._service.runtimes.live().get(model)
        return {
            "id": "chatcmpl-" + secrets.token_hex(12),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": runtime.generation if runtime is not None else None,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.text},
                    "finish_reason": reply.finish_reason.value,
                }
            ],
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": reply.usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + reply.usage.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
            },
            "werk": {
                "state_id": state_id,
                "state_tokens": state_tokens,
                "reuse": msgspec.to_builtins(kept.reuse),
                "evaluated_tokens": usage.evaluated_tokens,
                "superseded": superseded,
            },
        }

    async def _continues_live(self, model: str, allow: bool) -> bool:
        """Whether the model's running backend has proven prefix continuation for this request:
        the reply can then be kept by continuing the decoded state. Before the proof (a runtime
        not started yet, its probe not run), the turn's prompt is kept on disk as well."""
        runtime = self._service.runtimes.live().get(model)
        if runtime is None or not runtime.alive:
            return False
        return prefix_proven(await self._service.rows_for(runtime.model, runtime), allow)

    async def _keep_turn(
        self,
        principal: str,
        conversation: PrefillRequest,
        text: str,
        turn: DecodedTurn,
        *,
        prompt_kept: bool,
    ) -> tuple[StateSummary, PrefillOutcome] | None:
        """The turn's messages with its reply kept as the conversation's state (the next turn
        then evaluates only its own message), continuing the state the reply was decoded from;
        the messages alone when the reply is empty and the turn's prompt was not kept yet.
        ``None`` when nothing more could be kept (logged when keeping failed): the
        conversation's state is then the turn's prompt state, or else the one it continued."""
        if conversation.messages is None or (not text and prompt_kept):
            return None
        messages = conversation.messages
        if text:
            messages = [*messages, ChatMessage(role="assistant", content=text)]
        request = msgspec.structs.replace(conversation, messages=messages)
        try:
            return await self._flow.keep_continuation(principal, request, turn, origin="chat")
        except WerkError as exc:
            log.warning("a persisted chat turn was not kept in its state: %s", exc)
            return None

    async def _supersede(
        self, principal: str, state_id: str, *, grown: PrefillRequest | None = None
    ) -> list[str]:
        """Delete a state a persisted turn kept (never a pinned one). With ``grown``: only
        when ``grown`` — the turn that continued it — extends its whole conversation; one
        that shares only a part of it (another conversation with the same system prompt, a
        regenerated or edited reply) leaves it to the conversation it belongs to."""
        catalog = self._service.catalog
        try:
            stored = await anyio.to_thread.run_sync(lambda: catalog.get(principal, state_id))
        except NotFound:
            return []
        if stored.origin != "chat":
            return []
        if grown is not None and (
            not stored.prefixes
            or stored.prefixes[-1] not in self._flow.prompt_prefixes(principal, grown)
        ):
            return []
        request = PruneRequest(ids=[state_id], dry_run=False)
        busy = SkipReasonLookup(self._service, principal)  # a live handoff keeps it
        result = await anyio.to_thread.run_sync(
            lambda: catalog.prune(principal, request, busy=busy)
        )
        return list(result.deleted)
