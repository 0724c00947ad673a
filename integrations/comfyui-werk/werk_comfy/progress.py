"""ComfyUI's progress bar and interrupt button, where the pack runs inside ComfyUI.

``comfy.utils.ProgressBar(total, node_id)`` draws the bar on the node (``update_absolute``);
``comfy.model_management.processing_interrupted()`` is true once the user pressed Cancel.
Outside ComfyUI (the pack's own tests against a real ``werk serve``) both are absent and this
does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Progress", "stop_if_interrupted"]


class Progress:
    def __init__(self, total: int, node_id: str | None) -> None:
        self._bar: Any = None
        try:
            from comfy.utils import ProgressBar
        except ImportError:
            return
        self._bar = ProgressBar(total, node_id=node_id)

    def at(self, value: int) -> None:
        if self._bar is not None:
            self._bar.update_absolute(value)


def stop_if_interrupted(cancel: Callable[[], None]) -> None:
    """When the user pressed Cancel in ComfyUI: ``cancel()`` (the Werk job), then ComfyUI's
    own interrupt exception, as its samplers raise it."""
    try:
        from comfy import model_management
    except ImportError:
        return
    if model_management.processing_interrupted():
        cancel()
        model_management.throw_exception_if_processing_interrupted()
