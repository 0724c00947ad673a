"""What every Werk node shares: the optional ``server`` input, its default from the
environment, and ComfyUI's "run me every time" answer for nodes that mint or spend a
single-use value or read live figures."""

from __future__ import annotations

from typing import Any

from .choices import placeholder
from .client import WerkNodeError, WerkServer

__all__ = [
    "CATEGORY",
    "SERVER_INPUT",
    "SERVER_TYPE",
    "ModelNode",
    "always_run",
    "check_model",
    "server_of",
]

CATEGORY = "Werk"
SERVER_TYPE = "WERK_SERVER"
SERVER_INPUT: dict[str, Any] = {
    "server": (
        SERVER_TYPE,
        {"tooltip": "A Werk Server node; without one, $WERK_URL and $WERK_API_KEY"},
    )
}
MAX_SEED = 2**32 - 1


def server_of(server: WerkServer | None) -> WerkServer:
    return server if server is not None else WerkServer.from_environment()


def always_run(**_: Any) -> float:
    """``IS_CHANGED`` of a node whose output must never come from ComfyUI's cache: NaN is not
    equal to itself, so ComfyUI runs the node on every queue (a cached handoff would replay a
    spent token)."""
    return float("nan")


def check_model(model: str) -> bool | str:
    """``VALIDATE_INPUTS`` for a model dropdown: any name a workflow carries is accepted (the
    server may serve models the list did not show when the workflow was saved), but not the
    "no model list" entry."""
    if not model or placeholder(model):
        return f"choose a Werk model ({model or 'none chosen'})"
    return True


class ModelNode:
    """A node with a ``model`` dropdown: :func:`check_model` validates it."""

    @classmethod
    def VALIDATE_INPUTS(cls, model: str) -> bool | str:
        return check_model(model)


def text_of(answer: dict[str, Any]) -> str:
    """The assistant text of an OpenAI chat completion answer."""
    try:
        return str(answer["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        raise WerkNodeError("bad_response", "the chat answer carried no message") from None
