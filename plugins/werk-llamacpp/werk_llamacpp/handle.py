"""The plugin's own runtime object (``werk.Runtime.handle``) for one managed llama-server.

This module is the seam between the process layer (``process.py``, ``inspect.py``,
``args.py``: starting, inspecting and reaping the child) and the state layer (``slots.py``,
``probe.py``, ``states.py``: the functional probe and named states through the child's
``/slots`` API). Both sides use only what is declared here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

if TYPE_CHECKING:
    from werk import LoopbackClient

__all__ = ["LlamaHandle", "ProbeResult", "ProbeStatus"]


class ProbeStatus(enum.Enum):
    NOT_RUN = "not_run"
    PASSED = "passed"
    FAILED = "failed"


class ProbeResult(msgspec.Struct, frozen=True):
    status: ProbeStatus
    reason: str
    """One line for the capability rows: why the state capabilities are (un)available."""


@dataclass(eq=False)
class LlamaHandle:
    """Everything the plugin knows about one live llama-server child.

    :ivar base_url: ``http://127.0.0.1:<port>`` of the child (loopback only).
    :ivar api_key: the child's random per-spawn API key (sent as ``Authorization: Bearer``).
    :ivar http: a :class:`werk.LoopbackClient` bound to the child (its key already set): every
        ``/slots``, ``/tokenize`` and slot-bound ``/completion`` request goes through it.
    :ivar pid: the child's process id.
    :ivar generation: ``g_<hex>``, random per spawn (the same as ``Runtime.generation``).
    :ivar slot_dir: the private (0700) ``--slot-save-path`` directory of this child.
    :ivar total_slots: ``/props.total_slots`` (slot ids are validated against it; llama-server
        wraps out-of-range ids).
    :ivar state_slots: slot ids reserved for named states and the probe (never used by /v1).
    :ivar help_text: the executable's ``--help`` output (what flags it advertises).
    :ivar args: the effective argument list the child was started with.
    :ivar probe: the functional probe result for THIS generation.
    :ivar lineage: what a slot file of this process depends on (:func:`canary.lineage_of`);
        ``""`` when unknown (no cross-restart proof is attempted then).
    :ivar cross_restart: the probe's cross-restart step for THIS generation: passed only when
        a slot file an earlier generation of the same lineage saved restored and replayed
        correctly here.
    :ivar prefix: the probe's prefix-continuation step for THIS generation: passed only when
        a restored slot continued with a longer prompt reused exactly the restored prefix,
        evaluated the rest and reproduced a cold run of the longer prompt.
    :ivar slot_lock: serialises every /slots operation and state prefill/decode on this child.
    :ivar restored_slot: ``(slot, epoch, n_restored)`` of the last restore when nothing has
        evaluated in that slot since (the restore's acknowledged token count): a Prefill that
        continues that state with exactly its tokens evaluates nothing.
    :ivar log_path: the child's captured stdout/stderr.
    :ivar hold_seconds: how long a prefilled state is kept for its decode at most.
    :ivar wait_seconds: how long a state request waits in line for ``slot_lock`` at most.
    """

    base_url: str
    api_key: str
    http: LoopbackClient
    pid: int
    generation: str
    slot_dir: Path
    total_slots: int
    state_slots: tuple[int, ...]
    help_text: str
    args: tuple[str, ...]
    log_path: Path
    probe: ProbeResult = field(
        default_factory=lambda: ProbeResult(ProbeStatus.NOT_RUN, "the functional probe has not run")
    )
    slot_lock: anyio.Lock = field(default_factory=anyio.Lock)
    lineage: str = ""
    cross_restart: ProbeResult = field(
        default_factory=lambda: ProbeResult(
            ProbeStatus.NOT_RUN, "the functional probe (and its cross-restart step) has not run"
        )
    )
    prefix: ProbeResult = field(
        default_factory=lambda: ProbeResult(
            ProbeStatus.NOT_RUN, "the functional probe (and its prefix step) has not run"
        )
    )
    restored_slot: tuple[int, int, int] | None = None
    hold_seconds: float = 900.0
    wait_seconds: float = 30.0
