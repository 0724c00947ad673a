"""Prefix fingerprints: which saved state shares the longest prefix with a new prompt.

A state is found for an *exactly* equal prompt by its prompt fingerprint
(:func:`~werk.state.principals.prompt_fingerprint`). To continue a growing conversation from
its last saved state, a state also records a chain of fingerprints of its prompt's prefixes at
fixed boundaries, and a new prompt computes the same chain over itself:

* **messages**: after every message (``messages[:1]``, ``messages[:2]``, …);
* **a text prompt**: every :data:`PREFIX_CHARS` characters (``prompt[:256]``, ``prompt[:512]``,
  …). A shared text prefix shorter than that is never matched; the backend itself finds the
  exact common prefix of the tokens (llama-server's prompt cache does), so matching at the
  boundary below it loses nothing the backend keeps.

A state's chain includes its whole prompt when that ends on a boundary (a chat always does); a
new prompt's chain covers its proper prefixes only (the whole prompt is the exact lookup). A
state *matches* at the longest position both chains share. Each element is
``pp_`` + HMAC-SHA-256 under the principal's prompt key (as exact fingerprints are: keyed,
principal-scoped, model-scoped; two API keys never match each other's prefixes, and nothing
about the text can be read from it) over the model, the prompt form, the position and the
SHA-256 of the prefix; the prefix hashes are one running hash, so a chain costs one pass over
the prompt. At most :data:`MAX_CHAIN` elements are kept (the longest prefixes: a conversation
continues from its latest turns).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

from .principals import (
    DOMAIN_PROMPT_KEY,
    DOMAIN_PROMPT_PREFIX,
    NamespaceKey,
    hmac_input,
    is_principal,
)

__all__ = ["MAX_CHAIN", "PREFIX_CHARS", "PREFIX_PATTERN", "longest_shared", "prefix_chain"]

PREFIX_CHARS = 256
"""The boundary of text-prompt prefixes, in characters."""
MAX_CHAIN = 256
"""The most prefix fingerprints one prompt records (the longest prefixes)."""
PREFIX_PATTERN = r"^pp_[0-9a-f]{64}$"


def _length(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big")


def prefix_chain(
    key: NamespaceKey,
    principal: str,
    *,
    model: str,
    prompt: str | None = None,
    messages: Sequence[tuple[str, str]] | None = None,
    whole: bool = False,
) -> list[tuple[int, str]]:
    """``(position, fingerprint)`` at every boundary, shortest first, at most
    :data:`MAX_CHAIN` (the longest). Positions are characters of a prompt, messages of a chat.
    ``whole``: include the whole prompt when it ends on a boundary (a state's own chain).

    :raises ValueError: for a malformed principal or not exactly one prompt form.
    """
    if not is_principal(principal):
        raise ValueError("not a principal id")
    if (prompt is None) == (messages is None):
        raise ValueError("give exactly one of 'prompt' or 'messages'")
    principal_key = key._derive(DOMAIN_PROMPT_KEY, principal.encode("utf-8"))
    form = b"prompt" if prompt is not None else b"messages"
    running = hashlib.sha256()
    chain: list[tuple[int, str]] = []
    pieces: Iterable[tuple[int, bytes]]
    if prompt is not None:
        last = len(prompt) if whole else len(prompt) - 1
        pieces = (
            (end, prompt[end - PREFIX_CHARS : end].encode("utf-8"))
            for end in range(PREFIX_CHARS, last + 1, PREFIX_CHARS)
        )
    else:
        assert messages is not None
        count = len(messages) if whole else len(messages) - 1
        pieces = (
            (n, b"".join(_length(p) + p for p in (role.encode(), content.encode())))
            for n, (role, content) in enumerate(messages[:count], start=1)
        )
    for position, piece in pieces:
        running.update(piece)
        message = hmac_input(
            DOMAIN_PROMPT_PREFIX,
            model.encode("utf-8"),
            form,
            str(position).encode(),
            running.digest(),
        )
        digest = hmac.new(principal_key, message, hashlib.sha256).hexdigest()
        chain.append((position, "pp_" + digest))
    return chain[-MAX_CHAIN:]


def longest_shared(chain: Sequence[tuple[int, str]], fingerprints: Iterable[str]) -> int:
    """The longest position of ``chain`` whose fingerprint is among ``fingerprints`` (a
    state's own chain); 0 when none is."""
    known = set(fingerprints)
    for position, fingerprint in reversed(chain):
        if fingerprint in known:
            return position
    return 0
