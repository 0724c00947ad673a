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

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import anyio
import msgspec

from werk import (
    BackendError,
    NativeChatCache,
    NativeContext,
    Runtime,
    TurnOutcome,
    WerkError,
)

from .handle import LlamaHandle, ProbeStatus
from .inspect import child_environment
from .process import ManagedHandle, check_alive
from .proxy import PinnedSlot
from .slots import (
    allocator_for,
    erase_slot,
    llama_json,
    new_slot_filename,
    restore_slot,
    save_slot,
    slot_is_idle,
)

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

log = logging.getLogger("werk.llamacpp")

SCHEMA: Final = 1
SNAPSHOT_FORMAT: Final = "werk-llamacpp-chat-snapshot/1"
RECEIPT_FORMAT: Final = "werk-llamacpp-chat-receipt/1"
EVIDENCE: Final = "first_real_request_after_restore"
"""The only way a receipt may have been earned (an old synthetic-probe receipt proves nothing)."""

INDEX: Final = "index.json"
RECEIPT: Final = "capability.json"
TMP_PREFIX: Final = ".tmp-"
MAX_INDEX_BYTES = 256 * 1024
MAX_RECEIPT_BYTES = 16 * 1024
MAX_SNAPSHOT_BYTES = 1 << 40
MAX_TOKENS = 1 << 31
MAX_ARGS = 512
MAX_ARG_CHARS = 4096
MAX_LIBRARIES = 512
MAX_MAPS_BYTES = 16 * 1024 * 1024
COPY_CHUNK = 1 << 20

ENV_PREFIXES = (
    "GGML_",
    "CUDA_",
    "NVIDIA_",
    "HIP_",
    "ROCR_",
    "HSA_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "BLIS_",
    "VK_",
    "SYCL_",
    "ONEAPI_",
    "ZE_",
)
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD")
"""Environment of the child that can change native numerics or kernels (part of the namespace)."""

_SNAPSHOT_NAME = re.compile(r"^snapshot-[0-9a-f]{32}\.slot$")
_HEX64 = "^[0-9a-f]{64}$"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

Hex64 = Annotated[str, msgspec.Meta(pattern=_HEX64)]
Tokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_TOKENS)]
Bytes = Annotated[int, msgspec.Meta(ge=1, le=MAX_SNAPSHOT_BYTES)]
Arg = Annotated[str, msgspec.Meta(max_length=MAX_ARG_CHARS)]


# -- the records -------------------------------------------------------------------------------


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
    file: Annotated[str, msgspec.Meta(pattern=_SNAPSHOT_NAME.pattern)]
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


# -- private files -----------------------------------------------------------------------------


class Unsafe(Exception):
    """A path is not what the native layout allows (a link, another owner, a wrong mode...)."""


def open_private_dir(path: Path) -> int:
    """Open ``path`` (a directory owned by us, mode 0700, not a symbolic link)."""
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise Unsafe(f"{path.name} is a symbolic link or not a directory") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
        os.close(fd)
        raise Unsafe(f"{path.name} is not a private (0700) directory of this user")
    return fd


def _open_file(dir_fd: int, name: str, *, private: bool = True) -> tuple[int, os.stat_result]:
    """Open ``name`` for reading: a regular single-link file of ours (0600 when ``private``)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.EISDIR, errno.ENXIO):
            raise Unsafe(f"{name} is a link or not a regular file") from None
        raise
    st = os.fstat(fd)
    bad = (
        not stat.S_ISREG(st.st_mode)
        or st.st_uid != os.geteuid()
        or st.st_nlink != 1
        or (private and stat.S_IMODE(st.st_mode) != 0o600)
    )
    if bad:
        os.close(fd)
        raise Unsafe(f"{name} is not a private single-link file of this user")
    return fd, st


def _read_small(dir_fd: int, name: str, limit: int) -> bytes | None:
    """A whole private file of at most ``limit`` bytes; ``None`` when it does not exist.

    :raises Unsafe: not a private file, or larger than ``limit``.
    """
    try:
        fd, st = _open_file(dir_fd, name)
    except FileNotFoundError:
        return None
    try:
        if st.st_size > limit:
            raise Unsafe(f"{name} is larger than {limit} bytes")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise Unsafe(f"{name} is larger than {limit} bytes")
    return data


def _create(dir_fd: int, name: str) -> int:
    fd = os.open(name, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _replace_atomically(dir_fd: int, name: str, data: bytes) -> None:
    """Temporary file, fsync, rename over ``name``, fsync the directory."""
    tmp = TMP_PREFIX + secrets.token_hex(8)
    try:
        fd = _create(dir_fd, tmp)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            _unlink(dir_fd, tmp)
        raise
    os.fsync(dir_fd)


def _remove_durably(dir_fd: int, name: str) -> None:
    if _unlink(dir_fd, name):
        os.fsync(dir_fd)


def copy_hashing(src: int, dst: int, limit: int) -> tuple[str, int]:
    """Copy ``src`` to ``dst`` computing the SHA-256 of the very bytes copied (one pass).

    Reads at most ``limit + 1`` bytes, so a file longer than expected is noticed without
    reading all of it. Returns ``(sha256 hex, bytes copied)``.
    """
    digest = hashlib.sha256()
    copied = 0
    while copied <= limit:
        chunk = os.read(src, min(COPY_CHUNK, limit + 1 - copied))
        if not chunk:
            break
        digest.update(chunk)
        _write_all(dst, chunk)
        copied += len(chunk)
    return digest.hexdigest(), copied


# -- reading the records -----------------------------------------------------------------------


def read_index(dir_fd: int) -> tuple[SnapshotIndex | None, str]:
    """The published snapshot index, or ``None`` and why there is none (never raises for
    content: a link, an oversized or malformed index is "no usable snapshot")."""
    try:
        data = _read_small(dir_fd, INDEX, MAX_INDEX_BYTES)
    except (Unsafe, OSError) as exc:
        return None, f"the snapshot index is unusable ({_reason(exc)})"
    if data is None:
        return None, "no snapshot"
    try:
        head = _head_decoder.decode(data)
    except msgspec.DecodeError:
        return None, "the snapshot index is malformed"
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
    try:
        data = _read_small(dir_fd, RECEIPT, MAX_RECEIPT_BYTES)
    except (Unsafe, OSError) as exc:
        return ReceiptView(False, f"the receipt is unusable ({_reason(exc)})")
    if data is None:
        return ReceiptView(False, "no receipt")
    try:
        head = _head_decoder.decode(data)
    except msgspec.DecodeError:
        return ReceiptView(False, "the receipt is malformed")
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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc)


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


def _usage_int(usage: Mapping[str, Any] | None, *path: str) -> int | None:
    value: object = usage
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# -- the namespace ---------------------------------------------------------------------------


class Disabled(Exception):
    """Native snapshots cannot be trusted for this runtime (the reason is shown with ``-v``)."""


def mapped_libraries(pid: int, executable: Path) -> list[Path]:
    """The shared objects ``pid`` has mapped (from ``/proc/<pid>/maps``), without the
    executable itself, sorted.

    :raises Disabled: the map is unreadable, too large, names too many libraries, or shows a
        library that was replaced on disk after it was loaded (``(deleted)``).
    """
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            raw = f.read(MAX_MAPS_BYTES + 1)
    except OSError as exc:
        raise Disabled(f"the runtime's libraries cannot be listed ({_reason(exc)})") from None
    if len(raw) > MAX_MAPS_BYTES:
        raise Disabled("the runtime's memory map is too large to list its libraries")
    exe = os.path.realpath(executable)
    found: set[str] = set()
    for line in raw.decode("utf-8", "replace").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = fields[5].removesuffix(" (deleted)")
        is_exe = path == exe or os.path.realpath(path) == exe
        if not is_exe and ".so" not in os.path.basename(path):
            continue  # the model file, /dev/zero, memfd and other data mappings
        if path != fields[5]:
            raise Disabled("a runtime file was replaced on disk while the runtime uses it")
        if not is_exe:
            found.add(path)
    if len(found) > MAX_LIBRARIES:
        raise Disabled(f"the runtime maps more than {MAX_LIBRARIES} libraries")
    return sorted(Path(p) for p in found)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def environment_digest(environ: Mapping[str, str]) -> str:
    """SHA-256 of the variables (:data:`ENV_PREFIXES`, :data:`ENV_NAMES`) set in ``environ``."""
    relevant = sorted(
        (k, v) for k, v in environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES
    )
    return hashlib.sha256(msgspec.json.encode(relevant)).hexdigest()


def compute_namespace(runtime: Runtime, handle: ManagedHandle) -> tuple[Namespace, int]:
    """This runtime's namespace and how many libraries were hashed (blocking: run it in a
    worker thread, after native readiness).

    :raises Disabled: something cannot be identified, or the arguments exceed the bounds.
    """
    libraries = mapped_libraries(handle.pid, handle.inspection.path)
    lines = []
    for lib in libraries:
        try:
            lines.append([str(lib), _file_sha256(lib)])
        except OSError as exc:
            raise Disabled(f"a runtime library is unreadable ({_reason(exc)})") from None
    args = list(runtime.args)
    if len(args) > MAX_ARGS or any(len(a) > MAX_ARG_CHARS for a in args):
        raise Disabled("the effective arguments are too long to record")
    if not re.fullmatch(_HEX64, handle.inspection.sha256):
        raise Disabled("the runtime executable has no SHA-256")
    namespace = Namespace(
        model_identity=runtime.model.identity[:256],
        runtime_sha256=handle.inspection.sha256,
        libraries_sha256=hashlib.sha256(msgspec.json.encode(lines)).hexdigest(),
        environment_sha256=environment_digest(child_environment()),
        args=args,
        cache_layout=runtime.cache_layout[:1024],
    )
    return namespace, len(libraries)


# -- the provider ------------------------------------------------------------------------------


class _RestoreFailed(Exception):
    """The snapshot could not be restored; ``corrupt`` when the file itself is bad."""

    def __init__(self, reason: str, *, corrupt: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.corrupt = corrupt


def _seconds(start: float) -> str:
    return f"{time.monotonic() - start:.2f}s"


class LlamaChatCache:
    """The :class:`werk.NativeChatCache` of one persistent chat on one llama-server child.

    Create it with :func:`open_chat_cache`; the constructor and :meth:`load` exist separately
    so that tests can build one around a handle of their own.
    """

    def __init__(
        self,
        *,
        runtime: Runtime,
        handle: LlamaHandle,
        context: NativeContext,
        namespace: Namespace,
        slot: int,
        epoch: int,
    ) -> None:
        self.runtime = runtime
        self.handle = handle
        self.archive = context.archive
        self.phase: Callable[[str], None] = context.phase
        self.namespace = namespace
        self.slot = slot
        self.epoch = epoch
        self.index: SnapshotIndex | None = None
        self.receipt = ReceiptView(False, "no receipt")
        self._native: int | None = None
        self._first = True
        self._restored: tuple[int, str] | None = None
        """``(n_restored, snapshot sha256)`` until the first response after a restore."""
        self._disabled: str | None = None

    # -- startup -------------------------------------------------------------------------------

    def load(self) -> None:
        """Open ``native/`` if it exists (never creating it), drop leftovers of an interrupted
        save, read the index and judge the receipt. Reads files only; no request is sent."""
        path = self.archive.native_dir(create=False)
        if path is not None:
            self._native = open_private_dir(path)
            self.index, why = read_index(self._native)
            self._remove_leftovers()
        else:
            why = "no snapshot"
        self.receipt = read_receipt(self._native, self.namespace)
        if self.receipt.observed:
            self.phase(
                "native KV evidence: historical receipt: "
                f"{self.receipt.reason} (informational; this process checks again)"
            )
        else:
            self.phase(f"native KV evidence: unverified ({self.receipt.reason})")
        index = self.index
        if index is None:
            self.phase(
                f"native KV snapshot: {why}; the first request runs directly and its completed "
                "state is saved"
            )
        else:
            self.phase(
                f"native KV snapshot: {index.n_saved} tokens, {index.size} bytes; checked and "
                "restored lazily on the first real request"
            )

    def _remove_leftovers(self) -> None:
        fd = self._native
        assert fd is not None
        keep = self.index.file if self.index is not None else None
        removed = False
        for entry in os.listdir(fd):
            stale_snapshot = _SNAPSHOT_NAME.match(entry) is not None and entry != keep
            if entry.startswith(TMP_PREFIX) or stale_snapshot:
                with contextlib.suppress(IsADirectoryError, PermissionError):
                    removed |= _unlink(fd, entry)
        if removed:
            os.fsync(fd)

    # -- NativeChatCache -----------------------------------------------------------------------

    def _pinned(self, body: dict[str, Any]) -> dict[str, Any]:
        if self._disabled is not None:
            return body
        return {**body, "id_slot": PinnedSlot(slot=self.slot, generation=self.handle.generation)}

    def _owns_slot(self) -> bool:
        if not allocator_for(self.handle).current(self.slot, self.epoch):
            self._disable("the state slot was taken by another user of this runtime")
        return self._disabled is None

    def _disable(self, reason: str) -> None:
        if self._disabled is None:
            self._disabled = reason
            self.phase(f"native KV snapshots: off for the rest of this process ({reason})")

    async def before_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Restore the snapshot on the first real request (if one applies); pin the slot."""
        if self._first and self._disabled is None and check_alive(self.runtime):
            await self._restore_first(body)
            self._first = False
        return self._pinned(body)

    async def _restore_first(self, body: dict[str, Any]) -> None:
        index = self.index
        if index is None:
            self.phase("restore: no snapshot; the request runs directly")
            return
        other = index.namespace.differs(self.namespace)
        if other is not None:
            self.phase(
                f"restore: skipped; the snapshot was made with other {other}; the conversation "
                "is resent"
            )
            return
        messages = body.get("messages")
        history = messages[:-1] if isinstance(messages, list) else None
        if history is None or conversation_digest(history) != index.conversation_sha256:
            self.phase(
                "restore: skipped; the snapshot holds another state of this conversation; the "
                "conversation is resent"
            )
            return
        if not self._owns_slot():
            return
        start = time.monotonic()
        name = new_slot_filename("chat")
        try:
            await self._restore(index, name, start)
        except _RestoreFailed as exc:
            await self._restore_failed(exc.reason, corrupt=exc.corrupt)
        except WerkError as exc:
            await self._restore_failed(exc.message, corrupt=False)
        except (OSError, Unsafe) as exc:
            await self._restore_failed(_reason(exc), corrupt=False)
        except Exception as exc:
            log.exception("restoring the native chat snapshot failed")
            await self._restore_failed(f"unexpected {type(exc).__name__}", corrupt=False)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._clear_slot()
            raise
        finally:
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(self._remove_slot_file, name)

    async def _restore(self, index: SnapshotIndex, name: str, start: float) -> None:
        self.phase(
            "restore: verifying the snapshot (size, SHA-256) while copying it into the slot "
            "directory"
        )
        await anyio.to_thread.run_sync(self._copy_in, index, name)
        self.phase(f"restore: snapshot verified ({index.size} bytes) in {_seconds(start)}")
        handle, slot = self.handle, self.slot
        async with handle.slot_lock:
            if not self._owns_slot():
                raise _RestoreFailed("the slot is no longer this chat's")
            if not await slot_is_idle(handle, slot):
                raise _RestoreFailed(f"slot {slot} is busy")
            ack = await restore_slot(handle, slot, name)
            if ack.n_restored != index.n_saved or ack.n_read != index.n_written:
                raise _RestoreFailed(
                    f"the server acknowledged {ack.n_restored} tokens / {ack.n_read} bytes, "
                    f"not {index.n_saved} / {index.n_written}"
                )
            counter = await self._slot_counter()
            if counter is not None and counter != ack.n_restored:
                raise _RestoreFailed(
                    f"slot {slot} reports {counter} prompt tokens after restoring {ack.n_restored}"
                )
        self._restored = (ack.n_restored, index.sha256)
        self.phase(
            f"restore: {ack.n_restored} tokens restored into slot {slot} in {_seconds(start)}; "
            "reuse is checked on this request"
        )

    def _copy_in(self, index: SnapshotIndex, name: str) -> None:
        """Copy the snapshot into the slot directory under ``name``, hashing the bytes copied;
        size and SHA-256 must equal the index."""
        native = self._native
        if native is None:
            raise _RestoreFailed("the native directory is gone", corrupt=True)
        try:
            slots = open_private_dir(self.handle.slot_dir)
        except Unsafe as exc:
            raise _RestoreFailed(f"the runtime's slot directory is unsafe ({exc})") from None
        try:
            try:
                src, st = _open_file(native, index.file)
            except FileNotFoundError:
                raise _RestoreFailed("the snapshot file is missing", corrupt=True) from None
            except Unsafe as exc:
                raise _RestoreFailed(str(exc), corrupt=True) from None
            try:
                if st.st_size != index.size:
                    raise _RestoreFailed(
                        f"the snapshot has {st.st_size} bytes, the index says {index.size}",
                        corrupt=True,
                    )
                dst = _create(slots, name)
                try:
                    digest, copied = copy_hashing(src, dst, index.size)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
        finally:
            os.close(slots)
        if copied != index.size:
            raise _RestoreFailed(
                f"the snapshot has {copied} bytes, the index says {index.size}", corrupt=True
            )
        if digest != index.sha256:
            raise _RestoreFailed("the snapshot's SHA-256 does not match its index", corrupt=True)

    async def _slot_counter(self) -> int | None:
        """The slot's ``n_prompt_tokens`` when the server reports one (fresh slots omit it)."""
        data = await llama_json(self.handle, "GET", "/slots", "slot listing", timeout=30.0)
        if not isinstance(data, list):
            raise _RestoreFailed("the slot listing is malformed")
        entries = [e for e in data if isinstance(e, dict) and e.get("id") == self.slot]
        if len(entries) != 1:
            raise _RestoreFailed(f"the slot listing does not show slot {self.slot} once")
        value = entries[0].get("n_prompt_tokens")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise _RestoreFailed("the slot listing reports a malformed prompt counter")
        return value

    async def _restore_failed(self, reason: str, *, corrupt: bool) -> None:
        """Invalidate the receipt, clear the slot, drop a corrupt snapshot; the request goes on
        and rebuilds the conversation from the archive."""
        log.warning("native chat snapshot restore refused: %s", reason)
        self._restored = None
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(self._invalidate, corrupt)
            except OSError as exc:
                log.warning("invalidating the chat receipt failed: %s", _reason(exc))
            await self._clear_slot()
        self.phase(
            f"restore refused: {reason}; receipt invalidated, slot cleared, the conversation is "
            "rebuilt from the archive"
        )

    def _invalidate(self, corrupt: bool) -> None:
        native = self._native
        self.receipt = ReceiptView(False, "invalidated by a failed restore")
        if native is None:
            return
        _remove_durably(native, RECEIPT)
        if corrupt and self.index is not None:
            _remove_durably(native, INDEX)
            _remove_durably(native, self.index.file)
            self.index = None

    async def _clear_slot(self) -> None:
        try:
            async with self.handle.slot_lock:
                if allocator_for(self.handle).current(self.slot, self.epoch):
                    await erase_slot(self.handle, self.slot)
        except (WerkError, OSError) as exc:
            reason = exc.message if isinstance(exc, WerkError) else _reason(exc)
            self._disable(f"the slot could not be cleared: {reason}")

    def _remove_slot_file(self, name: str) -> None:
        slots = open_private_dir(self.handle.slot_dir)
        try:
            _unlink(slots, name)
        finally:
            os.close(slots)

    async def after_response(self, outcome: TurnOutcome) -> None:
        """Judge the evidence of a just-restored snapshot, then save a complete turn."""
        restored, self._restored = self._restored, None
        if restored is not None:
            await self._judge(outcome, *restored)
        if self._disabled is not None:
            return
        if not outcome.complete:
            self.phase("native KV snapshot: not saved (the turn did not complete)")
            return
        if not check_alive(self.runtime) or not self._owns_slot():
            return
        try:
            await self._save(outcome)
        except (WerkError, OSError, Unsafe) as exc:
            reason = exc.message if isinstance(exc, WerkError) else _reason(exc)
            log.warning("saving the native chat snapshot failed: %s", reason)
            self.phase(
                f"native KV snapshot: not saved ({reason}); the conversation archive holds the turn"
            )

    async def _judge(self, outcome: TurnOutcome, restored: int, snapshot_sha256: str) -> None:
        """Evidence from the first response after a restore of ``restored`` tokens."""
        cached = _usage_int(outcome.usage, "prompt_tokens_details", "cached_tokens")
        prompt = _usage_int(outcome.usage, "prompt_tokens")
        if not outcome.complete:
            self.phase(
                "native KV reuse: unverified (the first request after the restore did not complete)"
            )
        elif cached is None:
            self.phase("native KV reuse: unverified (the backend reported no cached-token count)")
        elif cached == 0:
            self.phase(
                "native KV reuse: cache miss (the backend reported 0 cached tokens; not proof "
                "of a broken restore)"
            )
        elif cached < 0 or cached > restored or (prompt is not None and cached > prompt):
            self.phase(
                f"native KV reuse: unverified (inconsistent usage: {cached} cached tokens, "
                f"{restored} restored, prompt {prompt})"
            )
        else:
            receipt = Receipt(
                schema=SCHEMA,
                format=RECEIPT_FORMAT,
                evidence=EVIDENCE,
                namespace=self.namespace,
                snapshot_sha256=snapshot_sha256,
                restored_tokens=restored,
                cached_tokens=cached,
                prompt_tokens=prompt if prompt is not None and prompt >= 1 else None,
                observed_at=time.time(),
            )
            try:
                await anyio.to_thread.run_sync(self._write_receipt, receipt)
            except (OSError, Unsafe) as exc:
                log.warning("recording the chat receipt failed: %s", _reason(exc))
            self.phase(
                f"native KV restored reuse observed: {cached} cached tokens of {restored} "
                "restored (first request after the restore)"
            )

    def _write_receipt(self, receipt: Receipt) -> None:
        native = self._native
        if native is None:
            raise Unsafe("the native directory is gone")
        data = msgspec.json.encode(receipt)
        if len(data) > MAX_RECEIPT_BYTES:
            raise Unsafe("the receipt would be oversized")
        _replace_atomically(native, RECEIPT, data)
        self.receipt = ReceiptView(True, "observed in this process", receipt)

    async def _save(self, outcome: TurnOutcome) -> None:
        messages = [*outcome.messages, {"role": "assistant", "content": outcome.reply}]
        digest = conversation_digest(messages)
        if digest is None:
            self.phase("native KV snapshot: not saved (the messages are not plain text)")
            return
        start = time.monotonic()
        name = new_slot_filename("chat")
        try:
            async with self.handle.slot_lock:
                if not self._owns_slot():
                    return
                ack = await save_slot(self.handle, self.slot, name)
            if ack.n_written > MAX_SNAPSHOT_BYTES or ack.n_saved > MAX_TOKENS:
                raise BackendError("the slot snapshot exceeds Werk's bounds")
            if self._native is None:
                path = self.archive.native_dir(create=True)
                assert path is not None
                self._native = open_private_dir(path)
            index = await anyio.to_thread.run_sync(
                self._publish, name, ack.n_saved, ack.n_written, digest
            )
        finally:
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(self._remove_slot_file, name)
        self.phase(
            f"native KV snapshot: saved {index.n_saved} tokens ({index.size} bytes, sha256 "
            f"{index.sha256[:12]}…) in {_seconds(start)}; file synced before the index"
        )

    def _publish(self, name: str, n_saved: int, n_written: int, conversation: str) -> SnapshotIndex:
        """Copy + hash in one pass, fsync, rename, fsync the directory, publish the index,
        then drop the previous snapshot file. Cleans up after itself on any failure."""
        native = self._native
        assert native is not None
        tmp = TMP_PREFIX + secrets.token_hex(8)
        final = f"snapshot-{secrets.token_hex(16)}.slot"
        published = False
        try:
            slots = open_private_dir(self.handle.slot_dir)
            try:
                src, _ = _open_file(slots, name, private=False)  # the server's umask decides
            finally:
                os.close(slots)
            try:
                dst = _create(native, tmp)
                try:
                    digest, copied = copy_hashing(src, dst, n_written)
                    if copied != n_written:
                        raise BackendError(
                            f"the server wrote {copied} bytes, not the {n_written} it acknowledged"
                        )
                    os.fsync(dst)
                finally:
                    os.close(dst)
            finally:
                os.close(src)
            os.rename(tmp, final, src_dir_fd=native, dst_dir_fd=native)
            os.fsync(native)
            index = SnapshotIndex(
                schema=SCHEMA,
                format=SNAPSHOT_FORMAT,
                file=final,
                sha256=digest,
                size=copied,
                n_saved=n_saved,
                n_written=n_written,
                namespace=self.namespace,
                conversation_sha256=conversation,
                saved_at=time.time(),
            )
            data = msgspec.json.encode(index)
            if len(data) > MAX_INDEX_BYTES:
                raise Unsafe("the snapshot index would be oversized")
            _replace_atomically(native, INDEX, data)
            published = True
        finally:
            if not published:
                for leftover in (tmp, final):
                    with contextlib.suppress(OSError):
                        _unlink(native, leftover)
        previous, self.index = self.index, index
        if previous is not None and previous.file != final:
            with contextlib.suppress(OSError):
                _remove_durably(native, previous.file)
        return index

    async def close(self) -> None:
        """Close ``native/`` (the slot goes with the runtime, which the engine stops next)."""
        fd, self._native = self._native, None
        if fd is not None:
            os.close(fd)


# -- the hook ----------------------------------------------------------------------------------


async def open_chat_cache(runtime: Runtime, context: NativeContext) -> NativeChatCache | None:
    """``werk_chat_native_cache``: a :class:`LlamaChatCache`, or ``None`` (with the reason as a
    ``-v`` phase) when native snapshots cannot be trusted for this runtime.

    Runs after native readiness: the executable's inspection (``--help``, ``--version`` and its
    SHA-256, in parallel, before the spawn) and its re-verification after readiness were done by
    the process layer; only now are the libraries hashed and the session's files read.
    """
    handle = runtime.handle
    phase = context.phase
    if not isinstance(handle, ManagedHandle) or not check_alive(runtime):
        return None
    inspection = handle.inspection
    phase(
        f"runtime inspection: llama-server {inspection.version}, sha256 {inspection.sha256[:12]}…"
        " (--help, --version and the hash ran in parallel before the spawn)"
    )
    reason: str | None = None
    if not inspection.valid:
        reason = "the runtime inspection is invalid: " + "; ".join(inspection.problems)
    elif not handle.state_slots or handle.probe.status is ProbeStatus.FAILED:
        reason = (
            handle.probe.reason
            if handle.probe.status is ProbeStatus.FAILED
            else ("the runtime has no state slot")
        )
    if reason is not None:
        phase(f"native KV snapshots: unavailable ({reason})")
        return None
    phase(
        f"native readiness: pid {handle.pid}, generation {handle.generation}; the executable "
        "was re-verified after readiness (identity and full SHA-256)"
    )
    start = time.monotonic()
    phase("preparation: cache file work was deferred until native startup completed")
    try:
        namespace, n_libraries = await anyio.to_thread.run_sync(compute_namespace, runtime, handle)
    except Disabled as exc:
        phase(f"native KV snapshots: unavailable ({exc})")
        return None
    async with handle.slot_lock:
        slot, epoch = allocator_for(handle).acquire()
    cache = LlamaChatCache(
        runtime=runtime,
        handle=handle,
        context=context,
        namespace=namespace,
        slot=slot,
        epoch=epoch,
    )
    phase(
        f"preparation: {n_libraries} runtime libraries hashed, namespace ready, state slot "
        f"{slot} reserved for this chat in {_seconds(start)}"
    )
    try:
        await anyio.to_thread.run_sync(cache.load)
    except (Unsafe, OSError) as exc:
        await cache.close()
        phase(f"native KV snapshots: unavailable (the native directory is unsafe: {_reason(exc)})")
        return None
    except BaseException:
        await cache.close()
        raise
    return cache
