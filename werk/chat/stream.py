"""Turning OpenAI chat-completion chunks into one assistant reply (and back into a response).

Both the in-process route (a backend's ``werk_openai`` stream) and the ``--server`` route (SSE
from ``/v1/chat/completions``) deliver the same JSON chunk objects; :class:`ReplyAccumulator`
reads them, hands each piece of text to the caller as it arrives and, at the end, rebuilds the
complete ``chat.completion`` object that ``werk run --json`` prints. A complete body (a backend
that answered without streaming) is accepted too.

Malformed chunks are refused with :class:`werk.BackendError`; an ``{"error": …}`` chunk becomes
the typed :class:`werk.WerkError` its code names. The reply text is bounded
(:data:`MAX_REPLY_CHARS`).
"""

from __future__ import annotations

import time
from typing import Any

from ..protocol import BackendError, ErrorCode, PayloadTooLarge, WerkError, error_class

__all__ = ["MAX_REPLY_CHARS", "ReplyAccumulator", "cached_tokens", "error_from_body"]

MAX_REPLY_CHARS = 8 * 1024 * 1024
_CODES = frozenset(code.value for code in ErrorCode)


def error_from_body(body: object, fallback: str) -> WerkError:
    """The typed error an OpenAI-shaped ``{"error": {"code", "message"}}`` object names."""
    detail = body.get("error") if isinstance(body, dict) else None
    if isinstance(detail, dict):
        code = detail.get("code")
        message = detail.get("message")
        text = message if isinstance(message, str) and message else fallback
        if isinstance(code, str) and code in _CODES:
            return error_class(code)(text)
        return BackendError(text)
    return BackendError(fallback)


def cached_tokens(usage: dict[str, Any] | None) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens`` when the backend reported it."""
    if not usage:
        return None
    details = usage.get("prompt_tokens_details")
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _malformed(what: str) -> BackendError:
    return BackendError(f"the backend sent a malformed reply ({what})")


class ReplyAccumulator:
    """Collects one reply. Call :meth:`feed` per chunk object; read the results afterwards.

    :ivar text: the reply text so far.
    :ivar finish_reason: set once a chunk carried one (``None`` means the reply is incomplete).
    :ivar usage: the ``usage`` object, when the backend sent one.
    """

    def __init__(self, model: str) -> None:
        self.model = model
        self.text = ""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.id: str | None = None
        self.created: int | None = None
        self.system_fingerprint: str | None = None

    def feed(self, obj: object) -> str:
        """Take one chunk (or a whole ``chat.completion``); return its new text (may be empty).

        :raises werk.WerkError: an error chunk, a malformed chunk, or a reply over the bound.
        """
        if not isinstance(obj, dict):
            raise _malformed("a chunk is not a JSON object")
        if "error" in obj:
            raise error_from_body(obj, "the backend failed while answering")
        self._meta(obj)
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = obj.get("choices")
        if not isinstance(choices, list):
            raise _malformed("'choices' is not a list")
        piece = ""
        for choice in choices:
            if not isinstance(choice, dict):
                raise _malformed("a choice is not an object")
            if choice.get("index", 0) != 0:
                continue
            piece += self._content(choice)
            finish = choice.get("finish_reason")
            if isinstance(finish, str) and finish:
                self.finish_reason = finish
        if len(self.text) + len(piece) > MAX_REPLY_CHARS:
            raise PayloadTooLarge(f"the reply is longer than {MAX_REPLY_CHARS} characters")
        self.text += piece
        return piece

    def _meta(self, obj: dict[str, Any]) -> None:
        if self.id is None and isinstance(obj.get("id"), str):
            self.id = obj["id"]
        created = obj.get("created")
        if self.created is None and isinstance(created, int) and not isinstance(created, bool):
            self.created = created
        fingerprint = obj.get("system_fingerprint")
        if isinstance(fingerprint, str):
            self.system_fingerprint = fingerprint

    @staticmethod
    def _content(choice: dict[str, Any]) -> str:
        holder = choice.get("delta", choice.get("message"))
        if holder is None:
            return ""
        if not isinstance(holder, dict):
            raise _malformed("'delta' is not an object")
        content = holder.get("content")
        if content is None:
            return ""
        if not isinstance(content, str):
            raise _malformed("'content' is not a string")
        return content

    def response(self) -> dict[str, Any]:
        """The complete OpenAI ``chat.completion`` object for what was received."""
        return {
            "id": self.id or "chatcmpl-werk",
            "object": "chat.completion",
            "created": self.created if self.created is not None else int(time.time()),
            "model": self.model,
            "system_fingerprint": self.system_fingerprint,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text},
                    "finish_reason": self.finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": self.usage,
        }
