"""How the kit words an exception: a typed Werk error, a plain exception the plugin raised, or
one the *host* raised while it called the plugin (so an author is not sent hunting in their own
code for a host bug or a value the host could not use)."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from types import ModuleType, TracebackType

from ..protocol import WerkError

__all__ = ["describe", "is_typed", "plugin_roots"]

_HOST = Path(__file__).resolve().parents[1]
_KIT = Path(__file__).resolve().parent


def plugin_roots(plugin: object) -> tuple[Path, ...]:
    """Where a plugin's code lives: its top-level package directory, or its one module file."""
    module = plugin if isinstance(plugin, ModuleType) else sys.modules.get(type(plugin).__module__)
    name = getattr(module, "__name__", "")
    top = sys.modules.get(name.split(".")[0]) if name else None
    roots: list[Path] = []
    for candidate in (top, module):
        file = getattr(candidate, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        roots.append(path.parent if path.name == "__init__.py" else path)
    return tuple(dict.fromkeys(roots))


def _frames(tb: TracebackType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb)) if tb is not None else []


def _within(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def _where(frame: traceback.FrameSummary, base: Path) -> str:
    path = Path(frame.filename).resolve()
    shown = path.relative_to(base) if path.is_relative_to(base) else path.name
    return f"{shown}:{frame.lineno} in {frame.name}"


def _host_origin(exc: BaseException, plugin: tuple[Path, ...]) -> str | None:
    """``None`` unless the innermost Werk-or-plugin frame of ``exc`` is host code (``werk/``,
    not the kit): then where, and where the plugin called it from if it did."""
    host_at: int | None = None
    plugin_at: int | None = None
    frames = _frames(exc.__traceback__)
    for i, frame in enumerate(frames):
        path = Path(frame.filename).resolve()
        if any(_within(path, root) for root in plugin):
            plugin_at = i
        elif _within(path, _HOST) and not _within(path, _KIT):
            host_at = i
    if host_at is None or (plugin_at is not None and plugin_at > host_at):
        return None
    where = f"in host code at werk/{_where(frames[host_at], _HOST)}"
    if plugin_at is not None:
        where += f", called from the plugin at {_where(frames[plugin_at], plugin[0].parent)}"
    return where


def _contained(exc: BaseException) -> BaseException | None:
    """The plain exception behind a Werk error the host raised ``from None`` around it."""
    inner = exc.__context__
    if exc.__suppress_context__ and inner is not None and not isinstance(inner, WerkError):
        return inner
    return None


def describe(exc: BaseException, plugin: tuple[Path, ...] = ()) -> str:
    """A Werk error as ``code: message``; a plain exception named with where it came from."""
    if isinstance(exc, WerkError):
        inner = _contained(exc)
        if inner is None:
            return f"{exc.code.value}: {exc.message}"
        host = _host_origin(inner, plugin)
        if host is not None:
            return (
                f"the host raised a plain {type(inner).__name__} ({inner}) {host}; "
                "this is not an exception of the plugin's own code"
            )
        return (
            f"the plugin raised a plain {type(inner).__name__} ({inner}); "
            "raise a werk.WerkError subclass instead"
        )
    host = _host_origin(exc, plugin)
    if host is not None:
        return f"the host raised {type(exc).__name__}: {exc} ({host})"
    return f"{type(exc).__name__}: {exc}"


def is_typed(exc: BaseException) -> bool:
    """A Werk error the plugin raised itself (not a plain exception the host contained)."""
    return isinstance(exc, WerkError) and _contained(exc) is None
