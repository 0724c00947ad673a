"""Werk Server (where Werk is and which key to use), Werk Memory (the host's and the
accelerators' figures and Werk's pressure level) and Werk Unload (free a model's memory before
a heavy image step)."""

from __future__ import annotations

import os
from typing import Any, ClassVar
from urllib.parse import quote

from .base import CATEGORY, SERVER_INPUT, SERVER_TYPE, always_run, server_of
from .choices import model_choices, placeholder
from .client import KEY_VARIABLE, WerkNodeError, WerkServer
from .handoff import WerkStateHandoff

__all__ = ["ANY", "WerkMemory", "WerkServerNode", "WerkUnload", "memory_summary"]


class _AnyType(str):
    """ComfyUI's ``*`` socket type (as its own ``IO.ANY``): links to and from every type."""

    __slots__ = ()

    def __ne__(self, other: object) -> bool:
        return False


ANY = _AnyType("*")
ALL = "(every loaded model)"


class WerkServerNode:
    """A Werk server for the other nodes' ``server`` input. The key is read from the named
    environment variable of ComfyUI's process (or a linked STRING), so it is never saved in
    the workflow or in an image's metadata."""

    CATEGORY = CATEGORY
    DESCRIPTION = "Where Werk runs and which API key to use (from an environment variable)."
    RETURN_TYPES = (SERVER_TYPE,)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("server",)
    FUNCTION = "connect"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "base_url": (
                    "STRING",
                    {
                        "default": "",
                        "tooltip": "http://host:port; empty: $WERK_URL, else "
                        "http://127.0.0.1:11434",
                    },
                ),
                "api_key_variable": (
                    "STRING",
                    {
                        "default": KEY_VARIABLE,
                        "tooltip": "The environment variable that holds "
                        "the API key (the key itself is never a widget: widgets are saved)",
                    },
                ),
            },
            "optional": {
                "api_key": (
                    "STRING",
                    {"forceInput": True, "tooltip": "A key from a linked node instead"},
                ),
            },
        }

    def connect(
        self, base_url: str, api_key_variable: str, api_key: str | None = None
    ) -> tuple[WerkServer]:
        key = api_key or (os.environ.get(api_key_variable.strip()) if api_key_variable else None)
        return (WerkServer.from_environment(base_url, key or ""),)


def _size(value: int | None) -> str:
    return "not observed" if value is None else f"{value / 2**30:.2f} GiB"


def memory_summary(memory: dict[str, Any]) -> str:
    """``GET /werk/v1/memory`` in a few lines (``null`` stays "not observed", never 0)."""
    lines = [f"pressure: {memory.get('pressure', 'unknown')}"]
    host = memory.get("host")
    if host:
        lines.append(
            f"host: {_size(host.get('used_bytes'))} used of {_size(host.get('total_bytes'))}, "
            f"{_size(host.get('available_bytes'))} available"
        )
    else:
        lines.append("host: not observed")
    accelerators = memory.get("accelerators")
    if accelerators is None:
        lines.append("accelerators: could not be sampled")
    elif not accelerators:
        lines.append("accelerators: none")
    for gpu in accelerators or []:
        lines.append(
            f"accelerator {gpu.get('index')} {gpu.get('name')}: "
            f"{_size(gpu.get('used_bytes'))} used of {_size(gpu.get('total_bytes'))}"
        )
    managed = memory.get("managed") or {}
    lines.append(
        f"Werk managed: {_size(managed.get('allocated_bytes'))} allocated, "
        f"{_size(managed.get('reserved_bytes'))} reserved"
    )
    return "\n".join(lines)


class WerkMemory:
    """``GET /werk/v1/memory`` → STRING (and shown on the node)."""

    CATEGORY = f"{CATEGORY}/System"
    DESCRIPTION = "Werk's memory figures and pressure level, read when the node runs."
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("memory",)
    FUNCTION = "read"
    OUTPUT_NODE = True
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {"required": {}, "optional": dict(SERVER_INPUT)}

    def read(self, server: WerkServer | None = None) -> dict[str, Any]:
        summary = memory_summary(server_of(server).request("GET", "/werk/v1/memory"))
        return {"ui": {"text": (summary,)}, "result": (summary,)}


class WerkUnload:
    """Unload one model, or every loaded one, through ``POST /werk/v1/models/{id}/unload``.
    Anything linked to ``passthrough`` comes out unchanged after the unload, so a graph can
    order it before a heavy step (Werk Chat's text → Werk Unload → the image prompt)."""

    CATEGORY = f"{CATEGORY}/System"
    DESCRIPTION = "Free Werk's memory before a heavy step; passes its input through."
    RETURN_TYPES = (ANY, "STRING")
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("passthrough", "report")
    FUNCTION = "unload"
    OUTPUT_NODE = True
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        choices = model_choices()
        models = sorted({*choices.chat, *choices.image, *choices.speech} - {""})
        return {
            "required": {"model": ([ALL, *(m for m in models if not placeholder(m))],)},
            "optional": {"passthrough": (ANY, {}), **SERVER_INPUT},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, model: str) -> bool | str:
        return True if model and not placeholder(model) else "choose a model or the first entry"

    def unload(
        self, model: str, passthrough: Any = None, server: WerkServer | None = None
    ) -> dict[str, Any]:
        if isinstance(passthrough, WerkStateHandoff):
            raise WerkNodeError("invalid_request", "a Werk handoff does not pass through Unload")
        werk = server_of(server)
        if model == ALL:
            listed = werk.request("GET", "/werk/v1/models").get("models", [])
            targets = [m["id"] for m in listed if m.get("resident")]
        else:
            targets = [model]
        done, skipped = [], []
        for target in targets:
            try:
                werk.request(
                    "POST", f"/werk/v1/models/{quote(target, safe='')}/unload", {"dry_run": False}
                )
                done.append(target)
            except WerkNodeError as exc:
                if exc.code not in ("conflict", "unsupported", "externally_managed"):
                    raise
                skipped.append(f"{target} ({exc.code})")
        report = f"unloaded: {', '.join(done) or 'none'}" + (
            f"; skipped: {', '.join(skipped)}" if skipped else ""
        )
        return {"ui": {"text": (report,)}, "result": (passthrough, report)}
