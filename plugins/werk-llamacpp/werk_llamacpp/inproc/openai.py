"""``/v1`` chat and text completions of ``llamacpp-inproc``, generated in this process.

The body is checked by :func:`werk.generation_args` (tools, structured output, images and other
fields this backend does not honour are refused, unknown fields too), the prompt rendered with
the model's chat template or tokenized as text, and the reply built by
:func:`werk.generation_reply` from the engine's events. ``usage.prompt_tokens_details
.cached_tokens`` is the prompt minus what llama.cpp evaluated for it. Chat requests keep their
sequence in the session cache afterwards; tool calling and images never reach it (refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from werk import OpenAICall, OpenAIReply, Runtime, generation_args, generation_reply

if TYPE_CHECKING:
    from .runtime import InprocHandle

__all__ = ["openai_reply"]

BACKEND = "llamacpp-inproc"


async def openai_reply(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    args = generation_args(call, BACKEND)
    handle: InprocHandle = runtime.handle
    engine = handle.engine
    chat = call.route == "chat.completions"

    def start() -> Iterator[dict[str, Any]]:
        if chat:
            tokens = engine.chat_tokens(args["messages"])
        else:
            tokens = engine.prompt_tokens(args["prompt"])
        return engine.generation(
            tokens,
            max_tokens=args.get("max_tokens"),
            temperature=args.get("temperature", 1.0),
            top_p=args.get("top_p", 1.0),
            seed=args.get("seed"),
            stops=args["stop"],
            remember=chat,
            prompt_ids=bool(args.get("return_token_ids")),
        )

    generation = handle.lane.generation(start, whole=not call.stream)
    return await generation_reply(call, runtime.model.id, generation)
