"""Werk Chat: one chat completion from a Werk model → STRING (a prompt for an image model, a
caption, …), optionally unloading the model afterwards to give its memory to the next step."""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from .base import CATEGORY, SERVER_INPUT, ModelNode, server_of, text_of
from .choices import model_choices
from .client import WerkServer

__all__ = ["WerkChat", "messages_of"]


def messages_of(system: str, prompt: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system.strip() else []
    return [*messages, {"role": "user", "content": prompt}]


class WerkChat(ModelNode):
    """A chat completion (``POST /v1/chat/completions``) with the model's chat template."""

    CATEGORY = f"{CATEGORY}/LLM"
    DESCRIPTION = "Ask a Werk chat model; the answer is a STRING."
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("text",)
    FUNCTION = "chat"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (model_choices().chat, {"tooltip": "A chat model Werk serves"}),
                "system": ("STRING", {"multiline": True, "default": ""}),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "max_tokens": ("INT", {"default": 256, "min": 1, "max": 65536}),
                "temperature": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 2.0, "step": 0.05}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**32 - 1}),
                "unload_after": (
                    "BOOLEAN",
                    {"default": False, "tooltip": "Unload the model when it has answered"},
                ),
            },
            "optional": dict(SERVER_INPUT),
        }

    def chat(
        self,
        model: str,
        system: str,
        prompt: str,
        max_tokens: int,
        temperature: float,
        seed: int,
        unload_after: bool,
        server: WerkServer | None = None,
    ) -> tuple[str]:
        werk = server_of(server)
        body = {
            "model": model,
            "messages": messages_of(system, prompt),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "stream": False,
        }
        answer = werk.request("POST", "/v1/chat/completions", body)
        if unload_after:
            werk.request(
                "POST", f"/werk/v1/models/{quote(model, safe='')}/unload", {"dry_run": False}
            )
        return (text_of(answer),)
