"""TEST CODE: the ``testkv`` "KV cache" — evaluated tokens, bound to one runtime generation.

Tokens are the UTF-8 bytes of the evaluated text: one token per byte, so ``prompt_tokens`` of
``"naïve"`` is 6. Chat messages are rendered to text first (:func:`render_messages`).

A live state is a :class:`KVState` (what ``handle`` states carry). Its persisted form
(:meth:`KVState.encode`) is, in order:

1. ``MAGIC`` (8 bytes, ``TESTKV01``);
2. the header length, 4 bytes big-endian, then the header: compact JSON with exactly the keys
   ``cache_layout``, ``generation``, ``model_identity``, ``weights`` and ``tokens`` (a count);
3. the token bytes;
4. a SHA-256 digest (32 bytes) of everything before it.

:func:`parse` checks all of it and raises :class:`werk.BackendError` for anything malformed
(wrong magic, bad checksum, bad header, wrong lengths). Whether a *well-formed* state belongs to
a runtime is a separate question (:meth:`KVState.check_compatible`), answered with
:class:`werk.IncompatibleState`. The host never looks inside any of this.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from werk import BackendError, IncompatibleState

__all__ = ["MAGIC", "MAX_STATE_BYTES", "KVState", "common_prefix", "parse", "render_messages"]

MAGIC = b"TESTKV01"
MAX_STATE_BYTES = 64 * 1024 * 1024
"""Payloads larger than this are refused before they are read (prompts are at most 16 MiB)."""
_MAX_HEADER_BYTES = 4096
_DIGEST_BYTES = 32
_HEADER_KEYS = frozenset({"cache_layout", "generation", "model_identity", "weights", "tokens"})


def render_messages(messages: Iterable[tuple[str, str]]) -> str:
    """The chat template: ``<|role|>\\ncontent\\n`` per message, then ``<|assistant|>\\n``.

    Two conversations that share their first messages share a rendered prefix, so reuse works
    across chat turns just as it does for plain prompts.
    """
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


def common_prefix(a: bytes, b: bytes) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(frozen=True, kw_only=True)
class KVState:
    """A live testkv state: the evaluated tokens and what produced them.

    :ivar generation: the runtime generation that evaluated the tokens.
    :ivar model_identity: the model's manifest identity.
    :ivar weights: ``sha256:`` of the model file's bytes.
    :ivar cache_layout: the layout string of the runtime that produced it.
    :ivar tokens: the evaluated tokens (UTF-8 bytes).
    """

    generation: str
    model_identity: str
    weights: str
    cache_layout: str
    tokens: bytes

    def _header(self) -> bytes:
        return json.dumps(
            {
                "cache_layout": self.cache_layout,
                "generation": self.generation,
                "model_identity": self.model_identity,
                "weights": self.weights,
                "tokens": len(self.tokens),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode("utf-8")

    def encode(self) -> bytes:
        """The persisted byte form described in the module docstring."""
        header = self._header()
        body = MAGIC + len(header).to_bytes(4, "big") + header + self.tokens
        return body + hashlib.sha256(body).digest()

    @property
    def encoded_size(self) -> int:
        """Exact size of :meth:`encode`'s result, without copying the tokens or hashing."""
        return len(MAGIC) + 4 + len(self._header()) + len(self.tokens) + _DIGEST_BYTES

    def check_compatible(
        self, *, generation: str, model_identity: str, weights: str, cache_layout: str
    ) -> None:
        """Raise :class:`werk.IncompatibleState` unless every producer field matches."""
        mismatched = [
            name
            for name, mine, theirs in (
                ("process generation", self.generation, generation),
                ("model identity", self.model_identity, model_identity),
                ("model weights", self.weights, weights),
                ("cache layout", self.cache_layout, cache_layout),
            )
            if mine != theirs
        ]
        if mismatched:
            raise IncompatibleState(
                "testkv state was produced by a different runtime ("
                + ", ".join(mismatched)
                + " differ)"
            )


def _malformed(why: str) -> BackendError:
    return BackendError(f"testkv state payload is malformed: {why}")


def parse(data: bytes) -> KVState:
    """Decode and verify a persisted payload.

    :raises werk.BackendError: the bytes are not a complete, intact testkv state.
    """
    if len(data) > MAX_STATE_BYTES:
        raise _malformed("larger than any state testkv writes")
    if len(data) < len(MAGIC) + 4 + _DIGEST_BYTES:
        raise _malformed("too short")
    if not data.startswith(MAGIC):
        raise _malformed("wrong magic")
    body, digest = data[:-_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.sha256(body).digest() != digest:
        raise _malformed("checksum mismatch")
    header_len = int.from_bytes(body[len(MAGIC) : len(MAGIC) + 4], "big")
    start = len(MAGIC) + 4
    if header_len > _MAX_HEADER_BYTES or start + header_len > len(body):
        raise _malformed("bad header length")
    try:
        header = json.loads(body[start : start + header_len].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _malformed("header is not JSON") from None
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        raise _malformed("header has the wrong fields")
    strings = [header[k] for k in ("cache_layout", "generation", "model_identity", "weights")]
    count = header["tokens"]
    if not all(isinstance(s, str) and s for s in strings):
        raise _malformed("header fields must be non-empty strings")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise _malformed("token count must be a non-negative integer")
    tokens = body[start + header_len :]
    if len(tokens) != count:
        raise _malformed("token count does not match the payload")
    return KVState(
        cache_layout=header["cache_layout"],
        generation=header["generation"],
        model_identity=header["model_identity"],
        weights=header["weights"],
        tokens=bytes(tokens),
    )
