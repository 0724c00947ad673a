"""CPU expert page preparation for MoE GGUF models that llama-server runs on the CPU.

A MoE model's expert tensors (``blk.N.ffn_{gate,up,down}_exps``) are read at random as tokens
route to experts, so the first requests of a cold start fault them in one page at a time. Before
spawning the child, :func:`prepare_expert_pages` finds the expert tensors' byte ranges in the
GGUF tensor directory (metadata only, through ``gguf.GGUFReader``) and hands them to the host's
page preparation (:func:`werk.prepare_pages_async`: complete pages only, the memory budget
checked first, at most two workers, 32 MiB chunks, a deadline and pressure checks between
chunks; any stop drops its mappings and the native load goes on unaffected). It finishes —
every worker joined — before the child is spawned; the retained mappings are dropped when the
runtime stops, before the host's model file-cache release.

It applies only when the model has expert tensors and the child cannot offload to an
accelerator (:func:`werk_llamacpp.requirement.offload_reason`). Only the first GGUF file is
inventoried (split models' other shards are left to the native loader). Native arguments,
placement and snapshot compatibility are unchanged: this warms the file cache, nothing else.

``WERK_LLAMA_EXPERT_PREPARATION``: ``auto`` (default: as above) or ``off``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from werk import (
    InvalidRequest,
    PageRange,
    PreparedPages,
    host_budget,
    prepare_pages_async,
)

from .inspect import Inspection
from .requirement import header_facts, offload_reason

__all__ = ["DEADLINE_SECONDS", "PREPARATION_ENV", "expert_ranges", "prepare_expert_pages"]

PREPARATION_ENV = "WERK_LLAMA_EXPERT_PREPARATION"
DEADLINE_SECONDS = 60.0


def expert_ranges(model: Path) -> list[PageRange]:
    """The byte ranges of the GGUF file's expert tensors (names containing ``_exps.``), from
    the header facts cached per file identity (:func:`.requirement.header_facts`)."""
    return [PageRange(offset, length) for offset, length in header_facts(model).expert_ranges]


def _enabled(environ: Mapping[str, str] | None) -> bool:
    env = os.environ if environ is None else environ
    value = env.get(PREPARATION_ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "off"):
        raise InvalidRequest(f"{PREPARATION_ENV} must be auto or off, not {value[:40]!r}")
    return value == "auto"


async def prepare_expert_pages(
    model: Path,
    native_args: Sequence[str],
    inspection: Inspection,
    *,
    environ: Mapping[str, str] | None = None,
    deadline_seconds: float = DEADLINE_SECONDS,
    ranges: Sequence[PageRange] | None = None,
) -> PreparedPages | None:
    """Prepare ``model``'s expert pages before the child starts; ``None`` when it does not
    apply (switched off, or no expert tensors). A MoE model that may run on an accelerator
    gets a ``skipped`` report. ``ranges``: an inventory already taken (default: take it now).
    Reading the header for the inventory maps the file's first pages, and the kernel's
    read-around may bring neighbouring pages in with them; the preparation itself reads
    nothing outside the expert ranges.

    :raises werk.InvalidRequest: a bad ``WERK_LLAMA_EXPERT_PREPARATION`` (a header that cannot
        be read only means nothing is prepared: the native loader reports it).
    """
    import anyio

    if not _enabled(environ):
        return None
    if ranges is None:
        try:
            ranges = await anyio.to_thread.run_sync(expert_ranges, model)
        except InvalidRequest:  # optional: llama-server reports a bad file in its own words
            return None
    if not ranges:
        return None
    reason = offload_reason(native_args, inspection)
    if reason is not None:
        return PreparedPages.skipped(reason)
    return await prepare_pages_async(
        model, ranges, deadline_seconds=deadline_seconds, budget=host_budget()
    )
