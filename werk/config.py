"""Where Werk keeps its files: ``WERK_HOME`` or the platform's user data directory."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["werk_home"]

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
