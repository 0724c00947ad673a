"""``echo``: a complete Werk backend in one module (made by ``werk plugins new``; the tutorial
of Werk's plugin guide walks through it).

Its "model" continues a prompt by repeating it, one character per token, so every answer is
predictable and the whole contract can be followed by eye:

* ``werk_register_backends`` registers ``echo`` with ``start``/``stop`` (an in-process engine);
* ``werk_openai`` serves ``/v1`` chat and text completions, streamed or not;
* ``werk_prefill``/``werk_decode`` evaluate a prompt into a live state and continue from it;
* ``werk_snapshot``/``werk_restore`` turn a live state into checksummed bytes and back;
* ``werk_capabilities`` reports the state rows ``experimental`` only after ``start`` ran a
  functional probe (:func:`werk.probe_state_hooks`: prefill, snapshot, restore, decode, a
  damaged snapshot refused) for this very runtime generation.

It imports only public names from :mod:`werk`. Hooks it does not implement (expert movement)
are reported ``unsupported`` by the host.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from werk import (
    BackendDescriptor,
    BackendError,
    BackendState,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    DecodeCall,
    DecodeOutcome,
    FinishReason,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    StateKind,
    StateProbe,
    hookimpl,
    probe_state_hooks,
)

BACKEND = "echo"
MAGIC = b"ECHO1"  # snapshot layout: MAGIC, sha256 of the text (32 bytes), the text (UTF-8)
STATE_ROWS = (
    CapabilityId.STATE_PREFIX_CACHE,
    CapabilityId.STATE_PERSISTENCE,
    CapabilityId.STATE_RESTORE,
    CapabilityId.STATE_TIER_DISK,
    CapabilityId.PD_PREFILL,
    CapabilityId.PD_DECODE,
    CapabilityId.PD_HANDOFF,
)


@dataclass
class Engine:
    """The runtime's handle: what ``start`` set up and what its probe found."""

    probe: StateProbe | None = None


# -- the "model" -----------------------------------------------------------------------------


def continuation(text: str, max_tokens: int, stop: Sequence[str] = ()) -> tuple[str, FinishReason]:
    """Echo ``text`` from its start, at most ``max_tokens`` characters, ending before the first
    stop string (which is not part of the reply)."""
    reply = text[:max_tokens]
    finish = FinishReason.LENGTH if len(text) > max_tokens else FinishReason.STOP
    cuts = [reply.find(s) for s in stop if s in reply]
    if cuts:
        reply, finish = reply[: min(cuts)], FinishReason.STOP
    return reply, finish


def _state(runtime: Runtime, text: str) -> BackendState:
    return BackendState(
        kind=StateKind.HANDLE, handle=text, generation=runtime.generation, tokens=len(text)
    )


def _text_of(runtime: Runtime, state: BackendState) -> str:
    if state.kind is not StateKind.HANDLE or state.generation != runtime.generation:
        raise BackendError("echo continues only live states of its own runtime")
    return str(state.handle)


# -- lifecycle -------------------------------------------------------------------------------


async def start(model: ModelSpec) -> Runtime:
    engine = Engine()
    runtime = Runtime(
        backend=BACKEND, model=model, generation="g_" + secrets.token_hex(8), handle=engine
    )
    # Prove the state hooks on this runtime: a restored snapshot must continue identically.
    engine.probe = await probe_state_hooks(
        runtime,
        prefill=werk_prefill,
        decode=werk_decode,
        snapshot=werk_snapshot,
        restore=werk_restore,
    )
    return runtime


async def stop(runtime: Runtime) -> None:
    runtime.alive = False


# -- hooks -----------------------------------------------------------------------------------


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND, formats=("txt",), description="tutorial backend", start=start, stop=stop
        )
    )


def _state_status(context: CapabilityContext) -> tuple[CapabilityStatus, str]:
    runtime = context.runtime
    if runtime is None or not runtime.alive:
        return CapabilityStatus.UNAVAILABLE, "no live echo runtime; the first request starts one"
    probe = runtime.handle.probe
    if probe is None or probe.generation != runtime.generation:
        return CapabilityStatus.UNAVAILABLE, "the functional probe has not run for this runtime"
    if not probe.passed:
        return CapabilityStatus.UNAVAILABLE, f"functional probe failed: {probe.reason}"
    return CapabilityStatus.EXPERIMENTAL, f"probe passed for generation {runtime.generation}"


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    status, reason = _state_status(context)
    rows = [CapabilityReport(id=cap, status=status, reason=reason) for cap in STATE_ROWS]
    rows.append(
        CapabilityReport(id=CapabilityId.MODEL_RESIDENCY, status=CapabilityStatus.SUPPORTED)
    )
    return rows


@hookimpl
def werk_prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    text = (
        call.prompt
        if call.prompt is not None
        else "\n".join(m.content for m in call.messages or ())
    )
    cached = 0
    if call.reuse_from is not None:
        previous = _text_of(runtime, call.reuse_from)
        while cached < min(len(previous), len(text)) and previous[cached] == text[cached]:
            cached += 1
    return PrefillOutcome(
        state=_state(runtime, text), prompt_tokens=len(text), cached_tokens=cached
    )


@hookimpl
def werk_decode(runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
    text, finish = continuation(_text_of(runtime, call.state), call.max_tokens, call.stop)
    return DecodeOutcome(text=text, finish_reason=finish, completion_tokens=len(text))


@hookimpl
def werk_snapshot(runtime: Runtime, state: BackendState) -> BackendState:
    data = _text_of(runtime, state).encode()
    payload = MAGIC + hashlib.sha256(data).digest() + data
    return BackendState(
        kind=StateKind.BYTES,
        data=payload,
        generation=runtime.generation,
        logical_bytes=len(payload),
    )


@hookimpl
def werk_restore(runtime: Runtime, payload: BackendState) -> BackendState:
    if payload.kind is StateKind.FILE and payload.path is not None:
        raw = payload.path.read_bytes()
    elif payload.kind is StateKind.BYTES and payload.data is not None:
        raw = payload.data
    else:
        raise BackendError(f"echo cannot restore a {payload.kind} payload")
    digest, data = raw[len(MAGIC) : len(MAGIC) + 32], raw[len(MAGIC) + 32 :]
    if not raw.startswith(MAGIC) or hashlib.sha256(data).digest() != digest:
        raise BackendError("the echo snapshot is damaged")
    return _state(runtime, data.decode())


def _prompt(call: OpenAICall) -> tuple[str, int]:
    body = call.body
    max_tokens = body.get("max_tokens", 16)
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("'max_tokens' must be a positive integer")
    if call.route == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise InvalidRequest("'prompt' must be a string")
        return prompt, max_tokens
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidRequest("'messages' must be a list of message objects")
    contents = [m.get("content") for m in messages]
    if not all(isinstance(c, str) for c in contents):
        raise InvalidRequest("every message needs string 'content'")
    return "\n".join(contents), max_tokens


def _choice(call: OpenAICall, text: str, finish: str | None, *, delta: bool) -> dict[str, Any]:
    if call.route == "completions":
        return {"index": 0, "text": text, "finish_reason": finish}
    key = "delta" if delta else "message"
    return {"index": 0, key: {"role": "assistant", "content": text}, "finish_reason": finish}


async def _chunks(call: OpenAICall, text: str, finish: str) -> AsyncIterator[bytes]:
    """One SSE payload per word, then one with ``finish_reason`` (``werk chat`` needs it).

    The host always closes this generator (``aclose``), also when the client goes away."""
    kind = "text_completion" if call.route == "completions" else "chat.completion.chunk"
    pieces = [*text.split(" "), None]
    for i, piece in enumerate(pieces):
        if piece is None:
            choice = _choice(call, "", finish, delta=True)
        else:
            choice = _choice(call, piece if i == 0 else " " + piece, None, delta=True)
        yield json.dumps({"object": kind, "choices": [choice]}).encode()


@hookimpl
def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    prompt, max_tokens = _prompt(call)
    text, finish = continuation(prompt, max_tokens)
    if call.stream:
        return OpenAIReply(stream=_chunks(call, text, finish.value))
    kind = "text_completion" if call.route == "completions" else "chat.completion"
    usage = {"prompt_tokens": len(prompt), "completion_tokens": len(text)}
    choice = _choice(call, text, finish.value, delta=False)
    return OpenAIReply(body={"object": kind, "choices": [choice], "usage": usage})
