"""The example third-party Werk backend ``echo`` (distribution ``werk-example-echo``).

Its hooks live in :mod:`werk_example_echo.plugin`; the ``werk`` entry point names that module.
"""

from .plugin import BACKEND, reverse

__all__ = ["BACKEND", "__version__", "reverse"]

__version__ = "0.1.0"
