"""Judging the first response after a restore: did the backend reuse the restored tokens?

Only that response can show restored reuse (later hits come from the live slot and prove
nothing about the restore): a complete response whose ``usage.prompt_tokens_details.
cached_tokens`` is positive and consistent (at most the restored tokens and the prompt tokens)
earns a :class:`~.records.Receipt`. Zero is a cache miss; missing or inconsistent usage stays
unverified.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from werk import TurnOutcome

from .records import EVIDENCE, RECEIPT_FORMAT, SCHEMA, Namespace, Receipt

__all__ = ["judge_reuse"]


def _usage_int(usage: Mapping[str, Any] | None, *path: str) -> int | None:
    value: object = usage
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def judge_reuse(
    outcome: TurnOutcome, restored: int, snapshot_sha256: str, namespace: Namespace
) -> tuple[str, Receipt | None]:
    """The ``-v`` phase line for the first response after a restore of ``restored`` tokens,
    and the receipt to record when it shows restored reuse."""
    cached = _usage_int(outcome.usage, "prompt_tokens_details", "cached_tokens")
    prompt = _usage_int(outcome.usage, "prompt_tokens")
    if not outcome.complete:
        return (
            "native KV reuse: unverified (the first request after the restore did not complete)",
            None,
        )
    if cached is None:
        return "native KV reuse: unverified (the backend reported no cached-token count)", None
    if cached == 0:
        return (
            "native KV reuse: cache miss (the backend reported 0 cached tokens; not proof "
            "of a broken restore)",
            None,
        )
    if cached < 0 or cached > restored or (prompt is not None and cached > prompt):
        return (
            f"native KV reuse: unverified (inconsistent usage: {cached} cached tokens, "
            f"{restored} restored, prompt {prompt})",
            None,
        )
    receipt = Receipt(
        schema=SCHEMA,
        format=RECEIPT_FORMAT,
        evidence=EVIDENCE,
        namespace=namespace,
        snapshot_sha256=snapshot_sha256,
        restored_tokens=restored,
        cached_tokens=cached,
        prompt_tokens=prompt if prompt is not None and prompt >= 1 else None,
        observed_at=time.time(),
    )
    return (
        f"native KV restored reuse observed: {cached} cached tokens of {restored} "
        "restored (first request after the restore)",
        receipt,
    )
