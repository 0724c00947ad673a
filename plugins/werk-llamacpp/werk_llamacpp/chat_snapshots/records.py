"""The records under ``native/``: the snapshot index, the reuse receipt and what both are valid
for (the :class:`Namespace`), with the rules that decide whether one read from disk is usable.

Reading never raises for content: a link, an oversized, malformed, other-schema or inconsistent
record is "no usable snapshot" (or "reuse unverified"), with the reason in words.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import msgspec

from .files import Unsafe, describe, read_small

__all__ = [
    "EVIDENCE",
    "HEX64",
    "INDEX",
    "MAX_ARGS",
    "MAX_ARG_CHARS",
    "MAX_INDEX_BYTES",
    "MAX_RECEIPT_BYTES",
    "MAX_SNAPSHOT_BYTES",
    "MAX_TOKENS",
    "RECEIPT",
    "RECEIPT_FORMAT",
    "SCHEMA",
    "SNAPSHOT_FORMAT",
    "SNAPSHOT_NAME",
    "Namespace",
    "Receipt",
    "ReceiptView",
    "SnapshotIndex",
    "conversation_digest",
    "read_index",
    "read_receipt",
]

SCHEMA: Final = 1
SNAPSHOT_FORMAT: Final = "werk-llamacpp-chat-snapshot/1"
RECEIPT_FORMAT: Final = "werk-llamacpp-chat-receipt/1"
EVIDENCE: Final = "first_real_request_after_restore"
"""The only way a receipt may have been earned (an old synthetic-probe receipt proves nothing)."""

INDEX: Final = "index.json"
RECEIPT: Final = "capability.json"
MAX_INDEX_BYTES = 256 * 1024
MAX_RECEIPT_BYTES = 16 * 1024
MAX_SNAPSHOT_BYTES = 1 << 40
MAX_TOKENS = 1 << 31
MAX_ARGS = 512
MAX_ARG_CHARS = 4096

SNAPSHOT_NAME = re.compile(r"^snapshot-[0-9a-f]{32}\.slot$")
HEX64: Final = "^[0-9a-f]{64}$"

Hex64 = Annotated[str, msgspec.Meta(pattern=HEX64)]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS)]
Bytes = Annotated[int, msgspec.Meta(ge=1, le=MAX_SNAPSHOT_BYTES)]
Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG_CHARS)]


class Namespace(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a snapshot (and a receipt) is valid for: the exact runtime that made it.

    :ivar model_identity: ``ModelSpec.identity`` (``sha256:…`` over the model's files).
    :ivar runtime_sha256: the llama-server executable's SHA-256 (re-verified after readiness).
    :ivar libraries_sha256: SHA-256 over the path and SHA-256 of every shared library the
        child has mapped.
    :ivar environment_sha256: SHA-256 over the child's native-relevant environment variables.
    :ivar args: the effective launch arguments (``Runtime.args``: per-spawn values and the
        key are placeholders, so they are stable for one configuration).
    :ivar cache_layout: ``Runtime.cache_layout`` (slot context, slot count).
    """

    model_identity: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    runtime_sha256: Hex64
    libraries_sha256: Hex64
    environment_sha256: Hex64
    args: Annotated[list[Arg], msgspec.Meta(max_length=MAX_ARGS)]
    cache_layout: Annotated[str, msgspec.Meta(max_length=1024)]

    def differs(self, other: Namespace) -> str | None:
        """What differs from ``other`` (the first difference, in words), or ``None``."""
        checks = (
            ("model files", self.model_identity == other.model_identity),
            ("runtime binary", self.runtime_sha256 == other.runtime_sha256),
            ("runtime libraries", self.libraries_sha256 == other.libraries_sha256),
            ("environment", self.environment_sha256 == other.environment_sha256),
            ("effective arguments", self.args == other.args),
            ("cache layout", self.cache_layout == other.cache_layout),
        )
        for what, same in checks:
            if not same:
                return what
        return None


class SnapshotIndex(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``native/index.json``: the published snapshot.

    :ivar file: the snapshot's file name in ``native/`` (``snapshot-<32 hex>.slot``).
    :ivar sha256: SHA-256 of the file, computed while it was copied.
    :ivar size: its length in bytes (equals ``n_written``).
    :ivar n_saved: tokens the server saved (the token count restored later).
    :ivar n_written: bytes the server wrote.
    :ivar namespace: the runtime it is valid for.
    :ivar conversation_sha256: :func:`conversation_digest` of the messages the slot holds
        (the request's messages plus the reply).
    """

    schema: Literal[1]
    format: Literal["werk-llamacpp-chat-snapshot/1"]
    file: Annotated[str, msgspec.Meta(pattern=SNAPSHOT_NAME.pattern)]
    sha256: Hex64
    size: Bytes
    n_saved: Tokens
    n_written: Bytes
    namespace: Namespace
    conversation_sha256: Hex64
    saved_at: Annotated[float, msgspec.Meta(ge=0)]


class Receipt(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``native/capability.json``: restored reuse was observed once (historical, informational).

    :ivar evidence: how it was observed; only :data:`EVIDENCE` counts.
    :ivar snapshot_sha256: the snapshot that was restored.
    :ivar restored_tokens: the acknowledged ``n_restored``.
    :ivar cached_tokens: the backend's ``cached_tokens`` on the first request after it.
    :ivar prompt_tokens: that request's ``prompt_tokens``, when reported.
    """

    schema: Literal[1]
    format: Literal["werk-llamacpp-chat-receipt/1"]
    evidence: Literal["first_real_request_after_restore"]
    namespace: Namespace
    snapshot_sha256: Hex64
    restored_tokens: Tokens
    cached_tokens: Tokens
    prompt_tokens: Tokens | None = None
    observed_at: Annotated[float, msgspec.Meta(ge=0)]


class _Head(msgspec.Struct, frozen=True):
    """The version fields of a record, read before the strict decode (unknown fields pass)."""

    schema: object = None
    format: object = None
    evidence: object = None


_index_decoder = msgspec.json.Decoder(SnapshotIndex)
_receipt_decoder = msgspec.json.Decoder(Receipt)
_head_decoder = msgspec.json.Decoder(_Head)


def _read_head(
    dir_fd: int, name: str, limit: int, what: str, missing: str
) -> tuple[bytes, _Head] | str:
    """The bytes of record ``name`` and its version fields, or why there are none (``missing``
    when the file does not exist)."""
    try:
        data = read_small(dir_fd, name, limit)
    except (Unsafe, OSError) as exc:
        return f"{what} is unusable ({describe(exc)})"
    if data is None:
        return missing
    try:
        return data, _head_decoder.decode(data)
    except msgspec.DecodeError:
        return f"{what} is malformed"


def read_index(dir_fd: int) -> tuple[SnapshotIndex | None, str]:
    """The published snapshot index, or ``None`` and why there is none (never raises for
    content: a link, an oversized or malformed index is "no usable snapshot")."""
    read = _read_head(dir_fd, INDEX, MAX_INDEX_BYTES, "the snapshot index", "no snapshot")
    if isinstance(read, str):
        return None, read
    data, head = read
    if head.schema != SCHEMA or head.format != SNAPSHOT_FORMAT:
        return None, f"the snapshot index has another schema ({head.schema!r}, {head.format!r})"
    try:
        index = _index_decoder.decode(data)
    except msgspec.DecodeError as exc:
        return None, f"the snapshot index is malformed ({exc})"
    if index.size != index.n_written:
        return None, "the snapshot index is inconsistent (size != n_written)"
    return index, "snapshot found"


@dataclass(frozen=True)
class ReceiptView:
    """What ``capability.json`` says now.

    :ivar observed: a valid receipt of this namespace records observed restored reuse.
    :ivar reason: why reuse is unverified (or a description of the evidence).
    :ivar receipt: the receipt, when ``observed``.
    """

    observed: bool
    reason: str
    receipt: Receipt | None = None


def read_receipt(dir_fd: int | None, namespace: Namespace) -> ReceiptView:
    """Judge ``capability.json`` against ``namespace``. Missing, unsafe, oversized, malformed,
    other-schema, synthetic-probe or other-namespace receipts leave reuse unverified."""
    if dir_fd is None:
        return ReceiptView(False, "no receipt")
    read = _read_head(dir_fd, RECEIPT, MAX_RECEIPT_BYTES, "the receipt", "no receipt")
    if isinstance(read, str):
        return ReceiptView(False, read)
    data, head = read
    if head.schema != SCHEMA or head.format != RECEIPT_FORMAT:
        return ReceiptView(False, f"the receipt has another schema ({head.schema!r})")
    if head.evidence != EVIDENCE:
        return ReceiptView(
            False, f"the receipt was not earned by a real request ({head.evidence!r})"
        )
    try:
        receipt = _receipt_decoder.decode(data)
    except msgspec.DecodeError as exc:
        return ReceiptView(False, f"the receipt is malformed ({exc})")
    if receipt.cached_tokens > receipt.restored_tokens or (
        receipt.prompt_tokens is not None and receipt.cached_tokens > receipt.prompt_tokens
    ):
        return ReceiptView(False, "the receipt is inconsistent")
    other = receipt.namespace.differs(namespace)
    if other is not None:
        return ReceiptView(False, f"the receipt was made with other {other}")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(receipt.observed_at))
    return ReceiptView(
        True,
        f"{receipt.cached_tokens} of {receipt.restored_tokens} restored tokens were reused "
        f"on {when}",
        receipt,
    )


def conversation_digest(messages: Sequence[object]) -> str | None:
    """SHA-256 of the ``(role, content)`` pairs of ``messages``; ``None`` if any is not text."""
    pairs: list[tuple[str, str]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            return None
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        pairs.append((role, content))
    return hashlib.sha256(msgspec.json.encode(pairs)).hexdigest()
