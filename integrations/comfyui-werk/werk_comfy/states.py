"""Split prefill/decode and named states.

Werk Prefill evaluates the prompt and answers a ``WERK_STATE_HANDOFF`` (the token stays
inside it, see :mod:`.handoff`); Werk Decode spends it once and answers the text. Werk Named
State is a prefill that keeps the evaluated prompt as a named state (``save``) or must continue
from one (``resume``), with its retention, TTL and pin. All three run on every queue (a cached
handoff would be a spent one) and pass ``allow_experimental`` only when its switch is on:
Werk reports llama.cpp's prefill, decode and states ``experimental`` until they are proven.
"""

from __future__ import annotations

from typing import Any, ClassVar
from urllib.parse import quote

from .base import CATEGORY, SERVER_INPUT, ModelNode, always_run, server_of
from .chat import messages_of
from .choices import model_choices
from .client import WerkNodeError, WerkServer
from .handoff import HANDOFF_TYPE, WerkStateHandoff

__all__ = ["WerkDecode", "WerkNamedState", "WerkPrefill"]

MAX_TTL = 2_592_000
_OPT_IN = (
    "BOOLEAN",
    {
        "default": False,
        "tooltip": "Allow capabilities Werk reports as experimental (llama.cpp's prefill and "
        "states are, until proven); off: such a request is refused",
    },
)


def _prompt_inputs() -> dict[str, Any]:
    return {
        "model": (model_choices().chat, {"tooltip": "A Werk model with prefill/decode"}),
        "system": ("STRING", {"multiline": True, "default": ""}),
        "prompt": ("STRING", {"multiline": True, "default": ""}),
    }


def _prefill(
    werk: WerkServer,
    model: str,
    messages: list[dict[str, str]],
    policy: dict[str, Any],
    allow_experimental: bool,
) -> tuple[WerkStateHandoff, dict[str, Any]]:
    body = {
        "model": model,
        "messages": messages,
        "policy": policy,
        "allow_experimental": allow_experimental,
    }
    answer = werk.request("POST", "/werk/v1/prefill", body)
    handoff = answer.pop("handoff")
    state = answer.get("state") or {}
    minted = WerkStateHandoff(
        handoff["token"],
        model=model,
        expires_at=handoff["expires_at"],
        server=werk,
        state_id=state.get("id"),
    )
    return minted, answer


class WerkPrefill(ModelNode):
    """``POST /werk/v1/prefill`` with an ephemeral policy: the prompt evaluated, nothing kept
    beyond the handoff (15 minutes, single use)."""

    CATEGORY = f"{CATEGORY}/State"
    DESCRIPTION = "Evaluate a prompt; decode it later (once) with Werk Decode."
    RETURN_TYPES = (HANDOFF_TYPE,)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("handoff",)
    FUNCTION = "prefill"
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {**_prompt_inputs(), "allow_experimental": _OPT_IN},
            "optional": dict(SERVER_INPUT),
        }

    def prefill(
        self,
        model: str,
        system: str,
        prompt: str,
        allow_experimental: bool,
        server: WerkServer | None = None,
    ) -> tuple[WerkStateHandoff]:
        policy = {"retention": "ephemeral", "reuse": "disabled"}
        messages = messages_of(system, prompt)
        handoff, _ = _prefill(server_of(server), model, messages, policy, allow_experimental)
        return (handoff,)


class WerkDecode:
    """``POST /werk/v1/decode``: spends the handoff (also when the decode fails) → STRING."""

    CATEGORY = f"{CATEGORY}/State"
    DESCRIPTION = "Generate from a Werk Prefill's handoff (single use)."
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("text",)
    FUNCTION = "decode"
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "handoff": (HANDOFF_TYPE, {}),
                "max_tokens": ("INT", {"default": 256, "min": 1, "max": 65536}),
                "temperature": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 2.0, "step": 0.05}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**32 - 1}),
                "stop": (
                    "STRING",
                    {"default": "", "multiline": True, "tooltip": "Stop sequences, one per line"},
                ),
            }
        }

    def decode(
        self,
        handoff: WerkStateHandoff,
        max_tokens: int,
        temperature: float,
        seed: int,
        stop: str,
    ) -> tuple[str]:
        if not isinstance(handoff, WerkStateHandoff):
            raise WerkNodeError("invalid_handoff", "the handoff input is not a Werk handoff")
        body = {
            "handoff": handoff.spend(),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "stop": [line for line in stop.splitlines() if line][:16],
        }
        answer = handoff.server.request("POST", "/werk/v1/decode", body, retry=False)
        return (str(answer["text"]),)


class WerkNamedState(ModelNode):
    """A prefill that keeps a named state of the prompt (``save``) or must continue one
    (``resume``): the next prompt that starts with this one continues from it instead of
    evaluating it again, also after ``werk serve`` restarts (``disk`` retention)."""

    CATEGORY = f"{CATEGORY}/State"
    DESCRIPTION = "Save or resume a named Werk state; decode its handoff with Werk Decode."
    RETURN_TYPES = (HANDOFF_TYPE, "STRING", "STRING")
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("handoff", "state_id", "report")
    FUNCTION = "run"
    IS_CHANGED = staticmethod(always_run)

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                **_prompt_inputs(),
                "action": (
                    ["save", "resume"],
                    {
                        "tooltip": "save: keep (or reuse) a state of this prompt; resume: the "
                        "prompt must continue a saved state (state_id, if given), else fail"
                    },
                ),
                "retention": (["disk", "memory", "auto"], {"default": "disk"}),
                "ttl_seconds": (
                    "INT",
                    {"default": 0, "min": 0, "max": MAX_TTL, "tooltip": "0: no expiry"},
                ),
                "pin": ("BOOLEAN", {"default": False, "tooltip": "Keep it from pruning"}),
                "allow_experimental": _OPT_IN,
            },
            "optional": {
                "state_id": ("STRING", {"default": "", "tooltip": "resume: the state to continue"}),
                "reply": (
                    "STRING",
                    {
                        "forceInput": True,
                        "tooltip": "The model's answer to the prompt (a Werk "
                        "Decode's text): with a follow-up, the conversation grows by one turn",
                    },
                ),
                "followup": (
                    "STRING",
                    {"multiline": True, "default": "", "tooltip": "The next user message"},
                ),
                **SERVER_INPUT,
            },
        }

    def run(
        self,
        model: str,
        system: str,
        prompt: str,
        action: str,
        retention: str,
        ttl_seconds: int,
        pin: bool,
        allow_experimental: bool,
        state_id: str = "",
        reply: str | None = None,
        followup: str = "",
        server: WerkServer | None = None,
    ) -> tuple[WerkStateHandoff, str, str]:
        werk = server_of(server)
        wanted = state_id.strip()
        if action == "resume" and wanted:
            # Fails with 404 not_found when it is unknown, expired or another key's.
            werk.request("GET", f"/werk/v1/states/{quote(wanted, safe='')}")
        policy = {
            "retention": retention,
            "reuse": "required" if action == "resume" else "prefer",
            "ttl_seconds": ttl_seconds or None,
            "pin": pin,
        }
        turns = []
        if followup.strip():
            turns = [
                {"role": "assistant", "content": reply or ""},
                {"role": "user", "content": followup},
            ]
        handoff, answer = _prefill(
            werk, model, messages_of(system, prompt) + turns, policy, allow_experimental
        )
        reuse = answer.get("reuse") or {}
        usage = answer.get("usage") or {}
        kept = handoff.state_id or reuse.get("state_id") or ""
        return handoff, kept, _report(reuse, usage, kept)


def _report(reuse: dict[str, Any], usage: dict[str, Any], kept: str) -> str:
    """ "reused (prefix match of st_…); prompt 64 tokens, 37 reused, 27 evaluated; state st_…"
    (a count the backend did not report is "?")."""

    def count(name: str) -> str:
        value = usage.get(name)
        return "?" if value is None else str(value)

    match = f" ({reuse['match']} match of {reuse['state_id']})" if reuse.get("match") else ""
    return (
        f"{reuse.get('outcome', '?')}{match}; prompt {count('prompt_tokens')} tokens, "
        f"{count('cached_tokens')} reused, {count('evaluated_tokens')} evaluated; "
        f"state {kept or 'none'}"
    )
