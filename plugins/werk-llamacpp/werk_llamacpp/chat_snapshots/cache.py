"""The :class:`werk.NativeChatCache` of one persistent chat on one llama-server child.

It owns the child's state slot (taken through the slot allocator, so a named state that had it
becomes stale) and pins every chat request to it. On the first real request of a process it
restores the session's snapshot when the index matches this runtime's namespace and the
conversation being continued; the first response after a restore is judged for evidence of
restored reuse; every complete turn is saved and published (:mod:`.store`). Any failure falls
back to resending the conversation from the archive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import anyio

from werk import (
    BackendError,
    NativeContext,
    Runtime,
    TurnOutcome,
    WerkError,
)

from ..handle import LlamaHandle
from ..process import check_alive
from ..proxy import PinnedSlot
from ..slots import (
    allocator_for,
    erase_slot,
    llama_json,
    new_slot_filename,
    restore_slot,
    save_slot,
    slot_is_idle,
)
from .evidence import judge_reuse
from .files import Unsafe, describe, open_private_dir, remove_durably
from .records import (
    INDEX,
    MAX_SNAPSHOT_BYTES,
    MAX_TOKENS,
    RECEIPT,
    Namespace,
    Receipt,
    ReceiptView,
    SnapshotIndex,
    conversation_digest,
    read_index,
    read_receipt,
)
from .store import (
    RestoreFailed,
    copy_in,
    publish,
    remove_leftovers,
    remove_slot_file,
    write_receipt,
)

__all__ = ["LlamaChatCache", "seconds"]

log = logging.getLogger("werk.llamacpp")


def seconds(start: float) -> str:
    """The time since ``start`` (``time.monotonic()``) for a ``-v`` phase."""
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
        self.native_dir = context.native_dir
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
        path = self.native_dir(False)
        if path is not None:
            self._native = open_private_dir(path)
            self.index, why = read_index(self._native)
            keep = self.index.file if self.index is not None else None
            remove_leftovers(self._native, keep)
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
        except RestoreFailed as exc:
            await self._restore_failed(exc.reason, corrupt=exc.corrupt)
        except (WerkError, OSError, Unsafe) as exc:
            await self._restore_failed(describe(exc), corrupt=False)
        except Exception as exc:
            log.exception("restoring the native chat snapshot failed")
            await self._restore_failed(f"unexpected {type(exc).__name__}", corrupt=False)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._clear_slot()
            raise
        finally:
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(remove_slot_file, self.handle.slot_dir, name)

    async def _restore(self, index: SnapshotIndex, name: str, start: float) -> None:
        self.phase(
            "restore: verifying the snapshot (size, SHA-256) while copying it into the slot "
            "directory"
        )
        await anyio.to_thread.run_sync(copy_in, self._native, self.handle.slot_dir, index, name)
        self.phase(f"restore: snapshot verified ({index.size} bytes) in {seconds(start)}")
        handle, slot = self.handle, self.slot
        async with handle.slot_lock:
            if not self._owns_slot():
                raise RestoreFailed("the slot is no longer this chat's")
            if not await slot_is_idle(handle, slot):
                raise RestoreFailed(f"slot {slot} is busy")
            ack = await restore_slot(handle, slot, name)
            if ack.n_restored != index.n_saved or ack.n_read != index.n_written:
                raise RestoreFailed(
                    f"the server acknowledged {ack.n_restored} tokens / {ack.n_read} bytes, "
                    f"not {index.n_saved} / {index.n_written}"
                )
            counter = await self._slot_counter()
            if counter is not None and counter != ack.n_restored:
                raise RestoreFailed(
                    f"slot {slot} reports {counter} prompt tokens after restoring {ack.n_restored}"
                )
        self._restored = (ack.n_restored, index.sha256)
        self.phase(
            f"restore: {ack.n_restored} tokens restored into slot {slot} in {seconds(start)}; "
            "reuse is checked on this request"
        )

    async def _slot_counter(self) -> int | None:
        """The slot's ``n_prompt_tokens`` when the server reports one (fresh slots omit it)."""
        data = await llama_json(self.handle, "GET", "/slots", "slot listing", timeout=30.0)
        if not isinstance(data, list):
            raise RestoreFailed("the slot listing is malformed")
        entries = [e for e in data if isinstance(e, dict) and e.get("id") == self.slot]
        if len(entries) != 1:
            raise RestoreFailed(f"the slot listing does not show slot {self.slot} once")
        value = entries[0].get("n_prompt_tokens")
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise RestoreFailed("the slot listing reports a malformed prompt counter")
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
                log.warning("invalidating the chat receipt failed: %s", describe(exc))
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
        remove_durably(native, RECEIPT)
        if corrupt and self.index is not None:
            remove_durably(native, INDEX)
            remove_durably(native, self.index.file)
            self.index = None

    async def _clear_slot(self) -> None:
        try:
            async with self.handle.slot_lock:
                if allocator_for(self.handle).current(self.slot, self.epoch):
                    await erase_slot(self.handle, self.slot)
        except (WerkError, OSError) as exc:
            reason = describe(exc)
            self._disable(f"the slot could not be cleared: {reason}")

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
            reason = describe(exc)
            log.warning("saving the native chat snapshot failed: %s", reason)
            self.phase(
                f"native KV snapshot: not saved ({reason}); the conversation archive holds the turn"
            )

    async def _judge(self, outcome: TurnOutcome, restored: int, snapshot_sha256: str) -> None:
        """Evidence from the first response after a restore of ``restored`` tokens."""
        line, receipt = judge_reuse(outcome, restored, snapshot_sha256, self.namespace)
        if receipt is not None:
            try:
                await anyio.to_thread.run_sync(self._write_receipt, receipt)
            except (OSError, Unsafe) as exc:
                log.warning("recording the chat receipt failed: %s", describe(exc))
        self.phase(line)

    def _write_receipt(self, receipt: Receipt) -> None:
        write_receipt(self._native, receipt)
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
                path = self.native_dir(True)
                assert path is not None
                self._native = open_private_dir(path)
            index = await anyio.to_thread.run_sync(
                self._publish, name, ack.n_saved, ack.n_written, digest
            )
        finally:
            with contextlib.suppress(OSError):
                await anyio.to_thread.run_sync(remove_slot_file, self.handle.slot_dir, name)
        self.phase(
            f"native KV snapshot: saved {index.n_saved} tokens ({index.size} bytes, sha256 "
            f"{index.sha256[:12]}…) in {seconds(start)}; file synced before the index"
        )

    def _publish(self, name: str, n_saved: int, n_written: int, conversation: str) -> SnapshotIndex:
        """Publish the server's file as the snapshot (:func:`~.store.publish`), then drop the
        previous snapshot file (only once the new index is durable)."""
        native = self._native
        assert native is not None
        index = publish(
            native,
            self.handle.slot_dir,
            name,
            n_saved=n_saved,
            n_written=n_written,
            namespace=self.namespace,
            conversation=conversation,
        )
        previous, self.index = self.index, index
        if previous is not None and previous.file != index.file:
            with contextlib.suppress(OSError):
                remove_durably(native, previous.file)
        return index

    async def close(self) -> None:
        """Close ``native/`` (the slot goes with the runtime, which the engine stops next)."""
        fd, self._native = self._native, None
        if fd is not None:
            os.close(fd)
