"""ComfyUI loads this folder (``ComfyUI/custom_nodes/<this folder>``) through this file."""

from .werk_comfy import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
