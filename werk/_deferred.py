"""``"module:function"`` references, resolved on first call.

A plugin names its ``start``/``stop``/``requirement`` functions as strings in its
:class:`werk.BackendDescriptor` so that loading the plugin (every ``werk`` command does) imports
none of its process code; the module is imported the first time the host calls the function.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from .protocol import Unavailable

__all__ = ["Deferred", "check_reference"]

_REFERENCE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$")


def check_reference(reference: str, what: str) -> None:
    """Refuse a string that is not ``package.module:function`` (checked at registration, before
    anything is imported)."""
    if not _REFERENCE.match(reference):
        raise ValueError(f"{what} {reference!r} must be 'package.module:function'")


class Deferred:
    """A callable standing for ``module:function``: the first call imports the module and looks
    the function up; every call then goes straight to it.

    :raises werk.Unavailable: (on the first call) the module does not import or has no such
        callable; the cause is chained and the import is tried again on the next call.
    """

    __slots__ = ("_function", "reference")

    def __init__(self, reference: str) -> None:
        self.reference = reference
        self._function: Callable[..., Any] | None = None

    def resolve(self) -> Callable[..., Any]:
        if self._function is None:
            module_name, _, name = self.reference.partition(":")
            try:
                function = getattr(importlib.import_module(module_name), name)
            except (ImportError, AttributeError) as exc:
                raise Unavailable(
                    f"{self.reference} cannot be loaded ({type(exc).__name__}: {exc})",
                    retryable=False,
                ) from exc
            if not callable(function):
                raise Unavailable(f"{self.reference} is not callable", retryable=False)
            self._function = function
        return self._function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Deferred({self.reference!r})"
