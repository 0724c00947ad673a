"""What a ``/v1`` chat or text-completion body asks of a backend that generates text itself
(a companion worker, a per-request runner), checked before anything runs.

:func:`generation_args` turns the body into the arguments such a backend's generator takes
(``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``return_token_ids``, and
``messages`` or ``prompt``). Fields that would change the answer if honoured but that these
backends do not do (tools, structured output, log-probabilities, penalties, several choices,
image or audio input) are refused with ``501 unsupported``, naming the field; unknown fields are
refused with ``400`` (a typo must not be silently ignored); malformed values are ``400`` naming
the field. Defaults follow OpenAI: ``temperature`` 1, ``top_p`` 1, chat ``max_tokens`` up to the
context, completions 16. ``return_token_ids`` is vLLM's (0.10.2 and later): the reply carries the
token ids (:mod:`werk.generation_reply`).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from .backends import OpenAICall
from .protocol import InvalidRequest, Unsupported

__all__ = ["generation_args"]

SAMPLING = {"max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop"}
COMMON = {"model", "stream", "stream_options", "n", "user", "return_token_ids"} | SAMPLING
CHAT_FIELDS = COMMON | {"messages", "metadata", "store"}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix", "logprobs"}
NOT_DONE = {
    "tools": "tool calling",
    "tool_choice": "tool calling",
    "functions": "function calling",
    "function_call": "function calling",
    "response_format": "structured output",
    "logprobs": "log-probabilities",
    "top_logprobs": "log-probabilities",
    "logit_bias": "logit bias",
    "presence_penalty": "penalties",
    "frequency_penalty": "penalties",
    "audio": "audio output",
    "modalities": "output modalities other than text",
    "prediction": "predicted outputs",
    "reasoning_effort": "reasoning controls",
}
"""Fields refused as ``unsupported`` unless their value is the no-op default."""
NO_OP: tuple[object, ...] = (
    None,
    False,
    0,
    0.0,
    {},
    [],
    "text",
    {"type": "text"},
    ["text"],
    "none",
)
ROLES = ("system", "developer", "user", "assistant")
MAX_IMAGE_BYTES = 20 * 1024 * 1024
"""The largest image a message may carry (decoded)."""
MAX_STOPS = 4


def _number(body: dict[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequest(f"'{name}' must be a number in [{low:g}, {high:g}]", param=name)
    return float(value)


def _whole(body: dict[str, Any], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidRequest(f"'{name}' must be a whole number >= {low}", param=name)
    return value


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise InvalidRequest(f"'stop' takes at most {MAX_STOPS} strings", param="stop")
    return [s for s in stops if s]


def _check_fields(body: dict[str, Any], allowed: set[str], route: str, backend: str) -> None:
    for name, what in NOT_DONE.items():
        if name in body and body[name] not in NO_OP:
            raise Unsupported(f"the {backend} backend does not do {what} ('{name}')")
    unknown = sorted(set(body) - allowed - set(NOT_DONE))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) for /v1/{route.replace('.', '/')}: {', '.join(unknown)} "
            f"(accepted: {', '.join(sorted(allowed))})",
            param=unknown[0],
        )
    if _whole(body, "n", 1) not in (None, 1):
        raise Unsupported(f"the {backend} backend answers one choice ('n' must be 1)")
    if _whole(body, "best_of", 1) not in (None, 1):
        raise Unsupported(f"the {backend} backend answers one choice ('best_of' must be 1)")
    if body.get("echo") or body.get("suffix"):
        raise Unsupported(f"the {backend} backend does not do 'echo' or 'suffix'")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", param="stream_options")


def _image(part: dict[str, Any], index: int) -> dict[str, str]:
    """An ``image_url`` part as ``{"type": "image", "url": DATA_URL}``: a ``data:image/…;base64,``
    URL whose payload decodes and fits :data:`MAX_IMAGE_BYTES` (nothing is fetched)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    where = f"messages[{index}]: an image_url part"
    if not isinstance(url, str) or not url.startswith("data:image/") or ";base64," not in url:
        raise InvalidRequest(
            f"{where} needs a data:image/...;base64, URL (Werk fetches no remote image)",
            param="messages",
        )
    payload = url.split(";base64,", 1)[1]
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise InvalidRequest(f"{where} is over {MAX_IMAGE_BYTES} bytes", param="messages")
    try:
        base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{where} is not valid base64", param="messages") from None
    return {"type": "image", "url": url}


def _content(
    message: dict[str, Any], index: int, backend: str, images: bool
) -> str | list[dict[str, str]]:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if content is None and message.get("role") == "assistant":
        return ""
    if not isinstance(content, list):
        raise InvalidRequest(
            f"messages[{index}].content must be a string or a list of parts", param="messages"
        )
    parts: list[dict[str, str]] = []
    for part in content:
        if not isinstance(part, dict):
            raise InvalidRequest(f"messages[{index}].content parts must be objects")
        if images and part.get("type") == "image_url":
            parts.append(_image(part, index))
            continue
        if part.get("type") != "text":
            raise Unsupported(
                f"the {backend} backend serves text; messages[{index}] has a "
                f"{part.get('type')!r} part"
            )
        if not isinstance(part.get("text"), str):
            raise InvalidRequest(f"messages[{index}]: a text part needs string 'text'")
        parts.append({"type": "text", "text": part["text"]})
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def _messages(body: dict[str, Any], backend: str, images: bool) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty list of messages", param="messages")
    converted = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequest(f"messages[{index}] must be an object", param="messages")
        role = message.get("role")
        if role == "tool" or message.get("tool_calls"):
            raise Unsupported(f"the {backend} backend does not do tool calling (a tool turn)")
        if role not in ROLES:
            raise InvalidRequest(
                f"messages[{index}].role must be one of {', '.join(ROLES)}", param="messages"
            )
        converted.append({"role": str(role), "content": _content(message, index, backend, images)})
    return converted


def _prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("'prompt' must be a string (one prompt per request)", param="prompt")
    return prompt


def generation_args(call: OpenAICall, backend: str, *, images: bool = False) -> dict[str, Any]:
    """The generator's arguments for ``call`` (``backend`` names the backend in refusals).

    With ``images``, a message's ``image_url`` parts are accepted (``data:`` URLs only, at most
    :data:`MAX_IMAGE_BYTES`): its content is then a list of ``{"type": "text", "text": ...}``
    and ``{"type": "image", "url": DATA_URL}`` parts, in order.

    :raises werk.InvalidRequest: a malformed or unknown field.
    :raises werk.Unsupported: a field these backends do not honour.
    """
    body = call.body
    chat = call.route == "chat.completions"
    _check_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, call.route, backend)
    limit = _whole(body, "max_completion_tokens", 1) if chat else None
    if limit is None:
        limit = _whole(body, "max_tokens", 1)
    if limit is None and not chat:
        limit = 16
    args: dict[str, Any] = {"max_tokens": limit, "stop": _stops(body)}
    for name, low, high in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        value = _number(body, name, low, high)
        if value is not None:
            args[name] = value
    if args.get("top_p") == 0.0:
        raise InvalidRequest("'top_p' must be greater than 0", param="top_p")
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise InvalidRequest("'seed' must be a whole number", param="seed")
        args["seed"] = seed % 2**63
    if body.get("return_token_ids") not in (None, False, True):
        raise InvalidRequest("'return_token_ids' must be a boolean", param="return_token_ids")
    if body.get("return_token_ids"):
        args["return_token_ids"] = True
    if chat:
        args["messages"] = _messages(body, backend, images)
    else:
        args["prompt"] = _prompt(body)
    return args
