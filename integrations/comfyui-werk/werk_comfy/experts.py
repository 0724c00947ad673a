"""Werk Experts Prefetch / Evict: MoE expert residency, an experimental Werk capability.

These nodes exist only when ComfyUI starts with ``WERK_COMFY_EXPERIMENTAL=1`` in its
environment (read once, when ComfyUI loads the pack: ComfyUI's own ``EXPERIMENTAL`` flag only
draws a badge); every request they send carries ``allow_experimental: true``, and they preview
(``dry_run``) unless switched to apply.
"""

from __future__ import annotations

import json
import os
from typing import Any, ClassVar
from urllib.parse import quote

from .base import CATEGORY, SERVER_INPUT, ModelNode, always_run, server_of
from .choices import model_choices
from .client import WerkNodeError, WerkServer

__all__ = ["OPT_IN_VARIABLE", "WerkExpertsEvict", "WerkExpertsPrefetch", "experimental_enabled"]

OPT_IN_VARIABLE = "WERK_COMFY_EXPERIMENTAL"


def experimental_enabled() -> bool:
    return os.environ.get(OPT_IN_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


class _ExpertAction(ModelNode):
    ACTION: ClassVar[str]
    CATEGORY = f"{CATEGORY}/Experts (experimental)"
    EXPERIMENTAL = True
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("result",)
    FUNCTION = "act"
    OUTPUT_NODE = True
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (model_choices().chat, {"tooltip": "A mixture-of-experts model"}),
                "experts": (
                    "STRING",
                    {"default": "", "tooltip": "Expert ids, separated by commas or lines"},
                ),
                "target": (["ram", "vram"], {"default": "ram"}),
                "dry_run": ("BOOLEAN", {"default": True, "tooltip": "Preview only"}),
            },
            "optional": dict(SERVER_INPUT),
        }

    def act(
        self,
        model: str,
        experts: str,
        target: str,
        dry_run: bool,
        server: WerkServer | None = None,
    ) -> dict[str, Any]:
        ids = [e.strip() for e in experts.replace(",", "\n").splitlines() if e.strip()]
        if not ids:
            raise WerkNodeError("invalid_request", "name at least one expert id")
        body = {"experts": ids, "target": target, "dry_run": dry_run, "allow_experimental": True}
        path = f"/werk/v1/experts/{quote(model, safe='')}/{self.ACTION}"
        result = json.dumps(server_of(server).request("POST", path, body), indent=1)
        return {"ui": {"text": (result,)}, "result": (result,)}


class WerkExpertsPrefetch(_ExpertAction):
    """``POST /werk/v1/experts/{model}/prefetch``."""

    ACTION = "prefetch"
    DESCRIPTION = "Experimental: move MoE experts of a Werk model into a memory tier."


class WerkExpertsEvict(_ExpertAction):
    """``POST /werk/v1/experts/{model}/evict``."""

    ACTION = "evict"
    DESCRIPTION = "Experimental: evict MoE experts of a Werk model from a memory tier."
