"""Native KV snapshots of persistent terminal chats on a Werk-managed llama-server.

The llama.cpp answer to the ``werk_chat_native_cache`` hook (seed: "Local llama.cpp startup and
lazy restore validation", "Local startup inspection and file I/O ordering", and the snapshot-copy
paragraph of "Reusing a worker from run"). It is opportunistic chat caching, not a state
capability: the conversation archive stays the source of truth, and every failure here falls
back to resending it.

**One slot.** The cache takes the child's state slot through the slot allocator (so a named
state that had it becomes stale) and pins every chat request to it with a
:class:`~werk_llamacpp.proxy.PinnedSlot`: the slot's KV cells are exactly this conversation's.
The child runs with ``--cache-ram 0`` (a precondition of the state slots), so a prompt-cache hit
on that slot can only come from the slot itself.

**Files** (under the session's ``native/``, 0700, reached without following links; every file
0600, single-link, size-bounded)::

    native/
    ├── snapshot-<hex>.slot   the server's slot bytes, copied out of the child's slot directory
    ├── index.json            SnapshotIndex: which file, its SHA-256 and size, n_saved/n_written,
    │                         the compatibility namespace and the conversation it covers
    └── capability.json       Receipt: historical "observed restored reuse" (informational)

**Save** (after a *complete* turn only): ``action=save`` of the slot under a Werk-generated name,
then one pass copies the file into ``native/.tmp-…`` while computing its SHA-256, the copy is
fsynced and renamed to a fresh ``snapshot-<hex>.slot``, the directory fsynced, and only then
``index.json`` is replaced atomically (temporary file, fsync, rename, directory fsync). The
previous snapshot file is removed after the new index is durable, so a crash at any point leaves
an index that names a complete file. The server's own file is deleted. An incomplete or failed
turn publishes nothing.

**Restore** (lazily, on the first real request of a process; no synthetic prompt ever): the
index must match this runtime's namespace (model identity, executable SHA-256, the SHA-256 of
every shared library the child mapped, the native-relevant environment, the effective
arguments, the cache layout, the schema) and the conversation being continued. The snapshot is
copied into the child's slot directory under a fresh private name while its SHA-256 is
computed; size and hash must equal the index before ``action=restore`` into the (idle) slot,
whose acknowledgement must be exact (``n_restored == n_saved``, ``n_read == n_written``) and
whose reported prompt counter, when the server reports one, must match. Any failure invalidates
the receipt, erases the slot and lets the request rebuild the conversation from the archive (a
corrupt snapshot is removed too).

**Evidence.** Only the first request after a restore can show restored reuse: a complete
response whose ``usage.prompt_tokens_details.cached_tokens`` is positive and consistent (at most
the restored tokens and the prompt tokens) records ``capability.json``. Zero is a cache miss;
missing or inconsistent usage stays unverified; later (live-slot) hits prove nothing about the
restore. A receipt read at startup is reported as historical evidence only when it is
well-formed, small, of this schema, made by a real request and of this namespace; anything else
leaves reuse unverified. Reading it never causes inference.
"""

from __future__ import annotations

from .cache import LlamaChatCache
from .files import COPY_CHUNK as COPY_CHUNK
from .files import TMP_PREFIX as TMP_PREFIX
from .files import Unsafe
from .files import copy_hashing as copy_hashing
from .files import open_private_dir as open_private_dir
from .hook import open_chat_cache
from .identity import ENV_NAMES as ENV_NAMES
from .identity import ENV_PREFIXES as ENV_PREFIXES
from .identity import MAX_LIBRARIES as MAX_LIBRARIES
from .identity import MAX_MAPS_BYTES as MAX_MAPS_BYTES
from .identity import Disabled as Disabled
from .identity import compute_namespace
from .identity import environment_digest as environment_digest
from .identity import mapped_libraries as mapped_libraries
from .records import (
    EVIDENCE,
    INDEX,
    RECEIPT,
    SCHEMA,
    SNAPSHOT_FORMAT,
    Namespace,
    Receipt,
    ReceiptView,
    SnapshotIndex,
    conversation_digest,
    read_index,
    read_receipt,
)
from .records import MAX_ARG_CHARS as MAX_ARG_CHARS
from .records import MAX_ARGS as MAX_ARGS
from .records import MAX_INDEX_BYTES as MAX_INDEX_BYTES
from .records import MAX_RECEIPT_BYTES as MAX_RECEIPT_BYTES
from .records import MAX_SNAPSHOT_BYTES as MAX_SNAPSHOT_BYTES
from .records import MAX_TOKENS as MAX_TOKENS
from .records import RECEIPT_FORMAT as RECEIPT_FORMAT

__all__ = [
    "EVIDENCE",
    "INDEX",
    "RECEIPT",
    "SCHEMA",
    "SNAPSHOT_FORMAT",
    "LlamaChatCache",
    "Namespace",
    "Receipt",
    "ReceiptView",
    "SnapshotIndex",
    "Unsafe",
    "compute_namespace",
    "conversation_digest",
    "open_chat_cache",
    "read_index",
    "read_receipt",
]
