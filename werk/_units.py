"""Byte counts as people read them (``926.4 MiB``): one formatter for messages and tables."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(value: int) -> str:
    """``1.5 GiB``-style size with one decimal (plain ``B`` below 1 KiB)."""
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")
