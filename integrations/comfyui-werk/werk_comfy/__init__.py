"""Werk nodes for ComfyUI (the V1 node API: every ComfyUI version runs it).

ComfyUI reads :data:`NODE_CLASS_MAPPINGS` and :data:`NODE_DISPLAY_NAME_MAPPINGS` from the
pack's folder (its ``__init__.py`` re-exports these). The expert nodes are in the mappings only
when ``WERK_COMFY_EXPERIMENTAL=1`` was set when the pack was loaded.
"""

from __future__ import annotations

from typing import Any

from .chat import WerkChat
from .experts import WerkExpertsEvict, WerkExpertsPrefetch, experimental_enabled
from .generate import WerkImage, WerkSpeech
from .states import WerkDecode, WerkNamedState, WerkPrefill
from .system import WerkMemory, WerkServerNode, WerkUnload

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "node_mappings"]
__version__ = "0.1.0"

_NODES: dict[str, tuple[type[Any], str]] = {
    "WerkServer": (WerkServerNode, "Werk Server"),
    "WerkChat": (WerkChat, "Werk Chat"),
    "WerkPrefill": (WerkPrefill, "Werk Prefill"),
    "WerkDecode": (WerkDecode, "Werk Decode"),
    "WerkNamedState": (WerkNamedState, "Werk Named State"),
    "WerkSpeech": (WerkSpeech, "Werk Speech"),
    "WerkImage": (WerkImage, "Werk Image"),
    "WerkMemory": (WerkMemory, "Werk Memory"),
    "WerkUnload": (WerkUnload, "Werk Unload"),
}
_EXPERIMENTAL: dict[str, tuple[type[Any], str]] = {
    "WerkExpertsPrefetch": (WerkExpertsPrefetch, "Werk Experts Prefetch (experimental)"),
    "WerkExpertsEvict": (WerkExpertsEvict, "Werk Experts Evict (experimental)"),
}


def node_mappings(experimental: bool) -> tuple[dict[str, type[Any]], dict[str, str]]:
    """The class and display-name mappings, with the expert nodes when ``experimental``."""
    nodes = {**_NODES, **(_EXPERIMENTAL if experimental else {})}
    return {k: v[0] for k, v in nodes.items()}, {k: v[1] for k, v in nodes.items()}


NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS = node_mappings(experimental_enabled())
