"""Durations as people type them: ``3600``, ``90s``, ``300ms``, ``5m``, ``1h30m``, ``2d``.

One parser for every place Werk takes a duration (``--keep-alive`` and a ``/v1`` body's
``keep_alive``, ``--older-than``); each caller adds its own sign rule and bounds.
"""

from __future__ import annotations

import math
import re

__all__ = ["parse_duration_seconds"]

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_seconds(text: str) -> float:
    """Non-negative seconds from a plain number or a sum of ``<number><unit>`` parts (units
    ``ms``, ``s``, ``m``, ``h``, ``d``; case-insensitive; no spaces, no sign).

    :raises ValueError: anything else, or a value that is not finite.
    """
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        seconds = float(value)
    else:
        parts = _PART.findall(value)
        if not value or "".join(n + u for n, u in parts) != value:
            raise ValueError(f"{text!r} is not a duration")
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite duration")
    return seconds
