"""Where Werk keeps its files: ``WERK_HOME`` or the platform's user data directory."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["werk_home", "whole_number_setting"]

HOME_ENV = "WERK_HOME"


def werk_home(environ: dict[str, str] | None = None) -> Path:
    """The active store root. ``WERK_HOME`` overrides the platformdirs default.

    Nothing is created here: read-only commands must not create directories.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(HOME_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute()
    return Path(platformdirs.user_data_dir("werk", appauthor=False))


BACKENDS_ENV = "WERK_BACKENDS_DIR"


def backends_dir(home: Path | None = None, environ: dict[str, str] | None = None) -> Path:
    """Where managed backend environments live: ``WERK_BACKENDS_DIR`` when set (several
    homes, or a test suite, can share one multi-gigabyte vLLM install), else
    ``<WERK_HOME>/backends``."""
    env = os.environ if environ is None else environ
    explicit = env.get(BACKENDS_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute()
    return (home if home is not None else werk_home(environ)) / "backends"


def whole_number_setting(name: str, default: int, minimum: int = 0) -> int:
    """The environment variable ``name`` as a whole number >= ``minimum`` (``default`` when
    unset or empty), for a plugin's settings (``WERK_MEDIA_PIPELINE_CACHE_SIZE``…).

    :raises werk.Unavailable: (``runtime.model_residency``, not retryable) it is not one; the
        message names the variable and its value.
    """
    from .protocol import CapabilityId, Unavailable

    raw = os.environ.get(name) or str(default)
    if not raw.isdigit() or int(raw) < minimum:
        raise Unavailable(
            f"{name}={raw!r} is not a whole number >= {minimum}",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    return int(raw)
