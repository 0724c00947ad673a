"""The model dropdowns: what the Werk server of the environment serves, asked when ComfyUI
builds its node list (``/object_info``) and when it validates a prompt.

Image models are the ones Werk lists for ComfyUI's ``CheckpointLoaderSimple`` (its
ComfyUI-compatible ``/object_info``: Diffusers pipelines), speech models those it lists for
``WerkTextToSpeech``; chat models are the rest of ``/werk/v1/models``. An answer is kept for
ten seconds (ComfyUI asks for every node, often). When no server answers, the list holds one
entry that says so; the nodes accept any model name typed or saved in a workflow (the server
then says whether it serves it).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .client import WerkNodeError, WerkServer

__all__ = ["Choices", "model_choices", "placeholder"]

_TTL = 10.0
_TIMEOUT = 2.0


@dataclass(frozen=True)
class Choices:
    chat: list[str]
    image: list[str]
    speech: list[str]


_lock = threading.Lock()
_cache: tuple[float, str, Choices] | None = None


def placeholder(name: str) -> bool:
    """Whether ``name`` is the "no server" entry rather than a model."""
    return name.startswith("<")


def model_choices() -> Choices:
    global _cache
    try:
        server = WerkServer.from_environment()
    except WerkNodeError as exc:
        return _unavailable(str(exc))
    with _lock:
        if _cache and _cache[1] == server.base_url and time.monotonic() - _cache[0] < _TTL:
            return _cache[2]
    try:
        choices = _ask(server)
    except WerkNodeError as exc:
        return _unavailable(str(exc))
    with _lock:
        _cache = (time.monotonic(), server.base_url, choices)
    return choices


def _ask(server: WerkServer) -> Choices:
    listed = server.request("GET", "/werk/v1/models", timeout=_TIMEOUT, retry=False)
    every = sorted(m["id"] for m in listed.get("models", []))
    image = _comfy_choices(server, "CheckpointLoaderSimple", "ckpt_name")
    speech = _comfy_choices(server, "WerkTextToSpeech", "model")
    chat = [m for m in every if m not in set(image) | set(speech)]
    none = ["<Werk serves no models: import one with `werk models import`>"]
    return Choices(chat=chat or none, image=image or none, speech=speech or none)


def _comfy_choices(server: WerkServer, node_class: str, name: str) -> list[str]:
    info = server.request("GET", f"/object_info/{node_class}", timeout=_TIMEOUT, retry=False)
    spec = info.get(node_class, {}).get("input", {}).get("required", {}).get(name, [[]])
    return sorted(str(m) for m in spec[0]) if spec and isinstance(spec[0], list) else []


def _unavailable(why: str) -> Choices:
    entry = [f"<no model list: {why}>"]
    return Choices(chat=entry, image=entry, speech=entry)
