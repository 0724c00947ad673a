"""Which hooks a test run actually called through a Werk plugin manager.

"Every hook is tested" means every hook is *called through the plugin manager* by some test,
not that its name appears in a test file. :func:`record_hook_calls` makes every
:class:`werk.WerkPluginManager` created afterwards report each hook call it dispatches (owner-only
subset calls included); :func:`unexercised` lists the hookspecs no call reached. Werk's own suite
does this for the whole run (the repository's ``conftest.py``); a plugin author can do the same
for the hooks of their plugin.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import FunctionType, ModuleType
from typing import Any

from .. import hookspecs as werk_hookspecs
from ..plugins import WerkPluginManager

__all__ = ["hookspec_names", "record_hook_calls", "unexercised"]


def hookspec_names(module: ModuleType = werk_hookspecs) -> list[str]:
    """The names of the hookspecs defined in ``module`` (``werk.hookspecs`` by default)."""
    marker = f"{werk_hookspecs.PROJECT_NAME}_spec"
    return sorted(
        name
        for name, obj in vars(module).items()
        if name.startswith("werk_")
        and isinstance(obj, FunctionType)
        and getattr(obj, marker, None) is not None
        and inspect.getmodule(obj) is module
    )


def unexercised(specs: Iterable[str], called: Iterable[str]) -> list[str]:
    """The hookspec names in ``specs`` that no recorded call reached."""
    seen = set(called)
    return sorted(name for name in specs if name not in seen)


@contextmanager
def record_hook_calls(into: set[str]) -> Iterator[set[str]]:
    """Add the name of every hook called by a plugin manager created inside the block to
    ``into`` (managers created before are not observed)."""
    original: Callable[..., None] = WerkPluginManager.__init__

    def before(hook_name: str, impls: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        if impls:
            into.add(hook_name)

    def after(outcome: Any, hook_name: str, impls: Sequence[Any], kwargs: Any) -> None:
        return None

    def init(self: WerkPluginManager, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.add_hookcall_monitoring(before, after)

    WerkPluginManager.__init__ = init  # type: ignore[method-assign]
    try:
        yield into
    finally:
        WerkPluginManager.__init__ = original  # type: ignore[method-assign]
