"""Path fields of the public value classes: a ``str`` (or any ``os.PathLike``) is converted to
``pathlib.Path``; anything else is refused with a ``TypeError`` naming the field, at the
boundary, instead of an ``AttributeError`` deep in the host."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["as_path"]


def as_path(value: object, field: str) -> Path:
    """``value`` as a :class:`~pathlib.Path`; :raises TypeError: naming ``field``."""
    if isinstance(value, Path):
        return value
    if isinstance(value, str | os.PathLike):
        return Path(value)
    raise TypeError(
        f"{field} must be a path (pathlib.Path or str), not {type(value).__name__}: {value!r}"
    )
