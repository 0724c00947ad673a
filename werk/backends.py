"""The in-process values that cross the backend contract (not wire shapes).

A plugin describes each backend it offers with a :class:`BackendDescriptor`. The host hands
operation hooks a :class:`Runtime` (one live backend instance for one model) and receives
backend state only as a :class:`BackendState`: an in-process handle, opaque bytes, an opaque
file, or an external connector key. The host accounts for state and moves it; it never decodes it.
"""

from __future__ import annotations

import enum
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from ._deferred import Deferred, check_reference
from ._paths import as_path
from .protocol.capabilities import CapabilityId
from .protocol.policy import PersistenceDefaults, Policy
from .protocol.prefill import ChatMessage, FinishReason
from .protocol.residency import ExpertTier, PagePreparation

__all__ = [
    "OPERATION_CAPABILITY",
    "BackendDescriptor",
    "BackendState",
    "CapabilityContext",
    "DecodeCall",
    "DecodeOutcome",
    "ExpertMove",
    "ExpertMoveOutcome",
    "ExpertObservation",
    "ExpertReport",
    "ModelFacts",
    "ModelSpec",
    "OpenAICall",
    "OpenAIReply",
    "OpenAIRoute",
    "Operation",
    "PrefillCall",
    "PrefillOutcome",
    "Runtime",
    "RuntimeRequirement",
    "StateKind",
]


class Operation(enum.StrEnum):
    """The operation hooks the host dispatches to the plugin that owns a runtime."""

    PREFILL = "werk_prefill"
    DECODE = "werk_decode"
    SNAPSHOT = "werk_snapshot"
    RESTORE = "werk_restore"
    MOVE_EXPERTS = "werk_move_experts"
    OBSERVE_EXPERTS = "werk_observe_experts"
    OPENAI = "werk_openai"


OPERATION_CAPABILITY: dict[Operation, CapabilityId] = {
    Operation.PREFILL: CapabilityId.PD_PREFILL,
    Operation.DECODE: CapabilityId.PD_DECODE,
    Operation.SNAPSHOT: CapabilityId.STATE_PERSISTENCE,
    Operation.RESTORE: CapabilityId.STATE_RESTORE,
    Operation.MOVE_EXPERTS: CapabilityId.EXPERTS_RESIDENCY,
    Operation.OBSERVE_EXPERTS: CapabilityId.EXPERTS_RESIDENCY,
}
"""The capability an operation hook provides; named in its ``unsupported`` error.

``werk_openai`` (plain inference through ``/v1``) is not a protocol capability and is absent."""


OpenAIRoute = Literal[
    "chat.completions",
    "completions",
    "images.generations",
    "images.edits",
    "audio.speech",
    "audio.transcriptions",
    "classifications",
    "embeddings",
]
"""A ``/v1`` route a backend can serve: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/images/generations``, ``/v1/images/edits``, ``/v1/audio/speech``,
``/v1/audio/transcriptions``, ``/v1/classifications`` (Werk's own: text classification),
``/v1/embeddings``."""


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A configured model as a backend sees it.

    :ivar id: the user-facing model id (``demo``).
    :ivar backend: the backend name that serves it.
    :ivar identity: ``sha256:…`` over the model's files (the manifest identity).
    :ivar files: absolute paths of the model's files (``str`` paths and lists are converted to
        a tuple of ``Path``; anything else raises ``TypeError`` naming ``ModelSpec.files``).
    :ivar options: backend-specific options from the manifest.
    :ivar persistence: the serving host's persistence defaults (``werk serve --persistence``
        and its granular flags), ``None`` without them. A backend whose native cache is
        switched by launch arguments reads it in ``start`` (local vLLM adds
        ``--enable-prefix-caching``, or ``--no-enable-prefix-caching`` for reuse
        ``disabled``); it is part of the spec, so a runtime started under other defaults is
        never reused for it.
    """

    id: str
    backend: str
    identity: str
    files: tuple[Path, ...] = ()
    options: dict[str, Any] = msgspec.field(default_factory=dict)
    persistence: PersistenceDefaults | None = None

    def __post_init__(self) -> None:
        """``files`` given as ``str`` (or any ``os.PathLike``), or as a list, become a tuple of
        ``Path``; anything else is refused here, naming the field, rather than failing later in
        the host."""
        if isinstance(self.files, str | os.PathLike):
            raise TypeError("ModelSpec.files must be a sequence of paths, not one path")
        converted = [as_path(item, "ModelSpec.files") for item in self.files]
        if not isinstance(self.files, tuple) or any(
            a is not b for a, b in zip(converted, self.files, strict=True)
        ):
            msgspec.structs.force_setattr(self, "files", tuple(converted))


MAX_REQUIREMENT_BYTES = 1 << 50
"""A requirement above 1 PiB is a broken computation, not a model (refused)."""


class RuntimeRequirement(msgspec.Struct, frozen=True, kw_only=True):
    """The memory one runtime needs, computed before it is started (admission control).

    :ivar nbytes: bytes to reserve: positive and at most :data:`MAX_REQUIREMENT_BYTES`; the
        bound the runtime may grow to, not what it holds right after start.
    :ivar tier: ``ram`` (host memory, the default) or ``vram`` (accelerator memory).
    :ivar parts: labelled parts that sum to ``nbytes`` (``("weights", n)``, ``("kv cache", n)``
        …), shown in a denial and in the docs' comparison; may be empty.
    :raises ValueError: a non-positive or unbounded count, an unknown tier, or parts that do not
        sum to ``nbytes``.
    """

    nbytes: int
    tier: Literal[ExpertTier.RAM, ExpertTier.VRAM] = ExpertTier.RAM
    parts: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if (
            not isinstance(self.nbytes, int)
            or isinstance(self.nbytes, bool)
            or not 0 < self.nbytes <= MAX_REQUIREMENT_BYTES
        ):
            raise ValueError(f"a requirement is 1..{MAX_REQUIREMENT_BYTES} bytes: {self.nbytes!r}")
        if self.tier not in (ExpertTier.RAM, ExpertTier.VRAM):
            raise ValueError(f"a requirement's tier is ram or vram, not {self.tier!r}")
        if self.parts and sum(n for _, n in self.parts) != self.nbytes:
            raise ValueError("a requirement's parts must sum to its byte count")


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend read from a model's files without loading it (``werk models show``).

    Every field but ``format`` is optional: ``None`` means "not stated in the files", never a
    guess.

    :ivar format: the file format read (``gguf``, ``diffusers``, ``transformers``).
    :ivar architecture: the model family the files name (``llama``, ``qwen2moe``,
        ``StableDiffusionPipeline``).
    :ivar parameters: the number of weights (sum of the tensors' element counts).
    :ivar quantization: the weights' storage type (``Q4_K_M``, ``F16``).
    :ivar context_length: the context the model was trained for.
    :ivar chat_template: whether the files carry a chat template.
    :ivar experts: experts per MoE layer (``None``: not a mixture of experts).
    :ivar experts_used: experts active per token.
    :ivar memory: the estimated need of one runtime at this model's options (weights, caches,
        buffers, in :attr:`RuntimeRequirement.parts`), when the backend can compute one.
    :ivar memory_basis: what the estimate assumes, for people (``"ctx 4096 × 5 slots, f16
        KV cache"``).
    """

    format: str
    architecture: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    chat_template: bool | None = None
    experts: int | None = None
    experts_used: int | None = None
    memory: RuntimeRequirement | None = None
    memory_basis: str = ""


class BackendDescriptor(msgspec.Struct, frozen=True, kw_only=True):
    """What a plugin registers through :func:`werk_register_backends`.

    :ivar name: unique backend name, lower-case (``llamacpp``); prefixes plugin capability ids.
    :ivar formats: model formats it serves (``gguf``, ``safetensors``, ``openai-endpoint``).
    :ivar description: one line for ``werk plugins``.
    :ivar start: optional coroutine function that starts a runtime for a model; backends that
        cannot start runtimes on this machine leave it ``None``. Like ``stop`` and
        ``requirement`` it may be given as a ``"package.module:function"`` string: the module
        is then imported on the first call, not when the plugin is loaded (every ``werk``
        command loads it), so a plugin keeps its process code out of ``import plugin`` with
        one line.
    :ivar stop: coroutine function that stops a runtime ``start`` returned (required with
        ``start``); it must reap every process the runtime owns.
    :ivar routes: the ``/v1`` routes its :func:`werk_openai` serves; the host answers
        ``unsupported`` for any other before a runtime is started.
    :ivar requirement: optional coroutine function ``ModelSpec -> RuntimeRequirement | None``
        awaited before every ``start``: the memory the runtime will need (weights, caches,
        buffers), from the model's files and the effective arguments. With it, ``werk serve``
        reserves the bytes before starting (unloading idle runtimes when they do not fit) and
        refuses a start that cannot fit with ``resource_exhausted``; ``None`` for one model
        means "no bound can be given" (it starts unaccounted). A raised :class:`werk.WerkError`
        fails the start. Requires ``start``.
    :ivar inspect: optional function ``ModelSpec -> ModelFacts`` (plain, not a coroutine; the
        command calls it directly) that reads the model's files without loading them. ``werk
        models import`` calls it before writing the manifest, so a file the backend cannot load
        is refused with its reason (raise :class:`werk.InvalidRequest`); ``werk models show``
        prints what it returns.
    :ivar states_in_process: its live states are objects inside ``werk serve`` (an in-process
        engine, not a child process): ``retention: memory`` then keeps them as named states of
        tier ``ram``, their bytes reserved in Werk's memory accounting, and the plugin may
        claim ``runtime.state.tier.ram`` (requires ``werk_prefill``).
    """

    name: str
    formats: tuple[str, ...] = ()
    description: str = ""
    start: Callable[[ModelSpec], Awaitable[Runtime]] | str | None = None
    stop: Callable[[Runtime], Awaitable[None]] | str | None = None
    routes: tuple[OpenAIRoute, ...] = ("chat.completions", "completions")
    requirement: Callable[[ModelSpec], Awaitable[RuntimeRequirement | None]] | str | None = None
    inspect: Callable[[ModelSpec], ModelFacts] | str | None = None
    states_in_process: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"backend name {self.name!r} must be alphanumeric (with - or _)")
        if self.name != self.name.lower():
            raise ValueError(f"backend name {self.name!r} must be lower-case")
        if (self.start is None) != (self.stop is None):
            raise ValueError(f"backend {self.name!r} must give both start and stop, or neither")
        if self.requirement is not None and self.start is None:
            raise ValueError(f"backend {self.name!r} gives a requirement but cannot start")
        for field in ("start", "stop", "requirement", "inspect"):
            value = getattr(self, field)
            if isinstance(value, str):
                check_reference(value, f"backend {self.name!r}'s {field}")
                msgspec.structs.force_setattr(self, field, Deferred(value))

    async def start_runtime(self, spec: ModelSpec) -> Runtime:
        """Await ``start(spec)`` (importing a ``"module:function"`` on first use)."""
        if self.start is None or isinstance(self.start, str):
            raise ValueError(f"backend {self.name!r} cannot start runtimes")
        return await self.start(spec)

    async def stop_runtime(self, runtime: Runtime) -> None:
        """Await ``stop(runtime)`` (importing a ``"module:function"`` on first use)."""
        if self.stop is None or isinstance(self.stop, str):
            raise ValueError(f"backend {self.name!r} cannot stop runtimes")
        await self.stop(runtime)

    def inspect_model(self, spec: ModelSpec) -> ModelFacts | None:
        """``inspect(spec)`` (importing a ``"module:function"`` on first use); ``None`` when the
        backend reads no facts.

        :raises werk.InvalidRequest: the backend cannot load these files (the reason says why).
        """
        if self.inspect is None or isinstance(self.inspect, str):
            return None
        facts = self.inspect(spec)
        if not isinstance(facts, ModelFacts):
            raise TypeError(f"backend {self.name!r}'s inspect returned {type(facts).__name__}")
        return facts

    async def runtime_requirement(self, spec: ModelSpec) -> RuntimeRequirement | None:
        """Await ``requirement(spec)``; ``None`` when the backend gives none."""
        if self.requirement is None or isinstance(self.requirement, str):
            return None
        return await self.requirement(spec)


class Runtime(msgspec.Struct, kw_only=True):
    """One live backend instance serving one model.

    :ivar backend: the owning backend's name (dispatch goes only to its plugin).
    :ivar model: the model it serves.
    :ivar generation: random id of this process generation; states are bound to it.
    :ivar handle: the plugin's own object (process, client, ...). The host never inspects it.
    :ivar alive: ``False`` once the plugin detected that the runtime died (or the host did:
        when ``pid`` is Werk's child and has exited, before the plugin heard of it).
    :ivar executable: fingerprint of the backend executable (``sha256:…``; ``""`` in-process).
    :ivar args: the effective runtime arguments, in order (part of every state's envelope).
    :ivar cache_layout: the backend's own description of its state layout (opaque to the host).
    :ivar pid: the process that serves this runtime alone, if there is one (``werk ps`` shows
        it and the resident memory of its process tree); ``None`` for a runtime in a shared
        worker, an endpoint or in-process.
    :ivar preparation: what page preparation (:mod:`werk.memory.prepare`) did before the native
        load, if any applied (``werk ps -v`` shows it).
    """

    backend: str
    model: ModelSpec
    generation: str
    handle: Any = None
    alive: bool = True
    executable: str = ""
    args: tuple[str, ...] = ()
    cache_layout: str = ""
    pid: int | None = None
    preparation: PagePreparation | None = None


class CapabilityContext(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_capabilities` is asked about.

    :ivar backend: the backend whose rows are wanted (the plugin owns it).
    :ivar model: the model the rows are for, or ``None`` for backend-wide rows.
    :ivar runtime: the live runtime for that model, if one exists now.
    """

    backend: str
    model: ModelSpec | None = None
    runtime: Runtime | None = None


class StateKind(enum.StrEnum):
    HANDLE = "handle"
    BYTES = "bytes"
    FILE = "file"
    CONNECTOR = "connector"


class BackendState(msgspec.Struct, frozen=True, kw_only=True):
    """Opaque backend state. Exactly one of the value forms matches ``kind``.

    :ivar kind: which form the state takes.
    :ivar handle: an in-process object (``kind=handle``), valid only for ``generation``.
    :ivar data: opaque bytes (``kind=bytes``).
    :ivar path: an opaque file owned by the plugin until the host moves it (``kind=file``).
    :ivar connector_key: a key into an external store (``kind=connector``).
    :ivar logical_bytes: the state's size if the backend knows it.
    :ivar generation: the process generation that produced it.
    :ivar tokens: how many prompt tokens the state covers, if known.
    """

    kind: StateKind
    generation: str
    handle: Any = None
    data: bytes | None = None
    path: Path | None = None
    connector_key: str | None = None
    logical_bytes: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        present = {
            StateKind.HANDLE: self.handle is not None,
            StateKind.BYTES: self.data is not None,
            StateKind.FILE: self.path is not None,
            StateKind.CONNECTOR: self.connector_key is not None,
        }
        if not present[self.kind] or sum(present.values()) != 1:
            raise ValueError(f"a {self.kind} state must carry exactly its own value form")
        given: object = self.path  # typed Path | None; a plugin may pass a str
        if given is not None and not isinstance(given, Path):
            msgspec.structs.force_setattr(self, "path", as_path(given, "BackendState.path"))


class PrefillCall(msgspec.Struct, frozen=True, kw_only=True):
    """Arguments of :func:`werk_prefill`. ``prompt`` xor ``messages``.

    :ivar prompt: the text prompt (``POST /werk/v1/prefill`` with ``prompt``), or ``None``.
    :ivar messages: the chat messages (with ``messages``), or ``None``.
    :ivar policy: the effective (already defaulted) policy.
    :ivar keep: ``True`` when the host wants a named state back (retention is not ephemeral).
    :ivar reuse_from: a compatible state to continue from, when the host found one: a state
        of exactly this prompt (``continued`` false: nothing is left to evaluate), or — only
        when the backend reports ``runtime.state.restore.prefix`` ``experimental`` or
        ``supported`` — a state whose prompt shares a prefix with this one (``continued``
        true): the backend evaluates the rest on top of it and reports the reuse it observed
        in ``cached_tokens``.
    :ivar continued: whether ``reuse_from`` holds only a prefix of this prompt.
    :ivar decode: ``False`` when no decode will follow: the host keeps the state (``keep``)
        and snapshots it right away — a persisted chat keeping its reply in the conversation's
        state. A backend that holds a prefilled state for its decode need hold this one only
        until that snapshot.
    """

    prompt: str | None = None
    messages: Sequence[ChatMessage] | None = None
    policy: Policy = msgspec.field(default_factory=Policy)
    keep: bool = False
    reuse_from: BackendState | None = None
    continued: bool = False
    decode: bool = True


class PrefillOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_prefill` returns.

    :ivar state: the evaluated prefix (always present: decode continues from it).
    :ivar prompt_tokens: tokens in the prompt.
    :ivar cached_tokens: tokens the backend reports it reused, ``None`` if it does not say.
    :ivar restored_tokens: tokens of ``reuse_from`` the backend restored (from a ``file`` or
        ``bytes`` payload) for this prefill, by its own count; ``None`` when it restored none.
    """

    state: BackendState
    prompt_tokens: int
    cached_tokens: int | None = None
    restored_tokens: int | None = None


class DecodeCall(msgspec.Struct, frozen=True, kw_only=True):
    """Arguments of :func:`werk_decode`.

    :ivar state: the state the handoff carried (as :func:`werk_prefill` returned it).
    :ivar max_tokens: the most tokens to generate (1..65536).
    :ivar temperature: sampling temperature (0..2; 0 is greedy and must be deterministic).
    :ivar seed: the sampler's seed, or ``None``: the same seed and temperature must give the
        same text.
    :ivar stop: up to 16 stop strings: the text ends right before the first one generated
        (which is not part of it), with ``finish_reason`` ``stop``.
    :ivar restore: present when the state has a persisted (disk) copy: awaiting it returns that
        copy as a ``file`` payload the backend then owns, as in :func:`werk_restore`. A backend
        whose live state is no longer resident restores it from there (at most once) instead of
        failing; a backend that keeps every live state never calls it.
    :ivar continues: the host continues the state right after this decode (a persisted chat
        keeping its reply: a :func:`werk_prefill` with ``decode`` false whose prompt is this
        state's prompt plus the reply): keep the state as the reply left it for that prefill,
        and return it as ``DecodeOutcome.after``.
    :ivar on_text: present when a client waits for the reply as it is generated (a streamed
        persisted chat): await it with each new piece of the text, in order, as the backend
        produces it; the pieces must add up to the start of ``DecodeOutcome.text`` (the host
        sends whatever they leave out when the decode returns). A backend that cannot stream
        never calls it: the client then gets the text in one piece. An exception it raises
        (the client left, the text passed Werk's bound) must end the decode.
    """

    state: BackendState
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int | None = None
    stop: Sequence[str] = ()
    restore: Callable[[], Awaitable[BackendState]] | None = None
    continues: bool = False
    on_text: Callable[[str], Awaitable[None]] | None = None


class DecodeOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_decode` returns.

    :ivar text: the generated text (at most 1 MiB of UTF-8).
    :ivar finish_reason: ``stop`` (end of text or a stop string) or ``length`` (``max_tokens``).
    :ivar completion_tokens: how many tokens were generated.
    :ivar state: an optional replacement state to continue from (bound to a new handoff).
    :ivar after: with ``DecodeCall.continues``: the live state as the reply left it (where it
        now lives, if the decode had to move it), kept for the prefill that continues it;
        ``None`` when the backend does not keep it (the host then continues ``call.state``).
    """

    text: str
    finish_reason: FinishReason
    completion_tokens: int
    state: BackendState | None = None
    after: BackendState | None = None


class ExpertObservation(msgspec.Struct, frozen=True, kw_only=True):
    """What a backend reports about one expert.

    :ivar id: the backend's id of the expert (stable while the runtime lives).
    :ivar tier: where it is now: ``vram``, ``ram`` or ``external``.
    :ivar nbytes: its size, or ``None`` when not observed.
    """

    id: str
    tier: ExpertTier
    nbytes: int | None = None


class ExpertReport(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_observe_experts` returns.

    :ivar experts: the experts the backend observes now, with their tiers and known sizes.
    :ivar accesses: expert ids routed to since the last report (feeds the hotness score).
    :ivar complete: ``True`` when ``experts`` lists every expert (unlisted ones are dropped).
    """

    experts: Sequence[ExpertObservation]
    accesses: Sequence[str] = ()
    complete: bool = True


class ExpertMove(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`werk_move_experts` is asked to do.

    :ivar expert_ids: the experts to move (ids as observed).
    :ivar target: the tier to move them to (``vram``, ``ram`` or ``external``).
    """

    expert_ids: Sequence[str]
    target: str


class ExpertMoveOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """Which experts the backend actually moved; the host updates metadata only for these.

    :ivar moved: the ids now in the target tier.
    :ivar failed: the ids that could not be moved (they stay where they were).
    """

    moved: Sequence[str]
    failed: Sequence[str] = ()


class OpenAICall(msgspec.Struct, frozen=True, kw_only=True):
    """An OpenAI-compatible request for :func:`werk_openai`.

    :ivar route: one of :data:`OpenAIRoute` (only routes the backend's descriptor lists in
        ``routes`` reach it).
    :ivar body: the client's JSON object (``model`` already resolved to this runtime). For the
        media routes the host has validated it (:mod:`werk.protocol.media`) and every field is
        present; ``audio.transcriptions`` adds ``audio_b64`` (the uploaded WAV, base64).
    :ivar stream: whether the client asked for SSE streaming.
    :ivar cache_salt: a salt derived from the caller's principal with the server's namespace key
        (never the API key, and not computable without that key). A backend whose prefix cache
        is shared between requests must pass it on (vLLM's ``cache_salt``) so that one API key
        cannot reuse, or time, another's cached prompts. ``None`` outside a server.
    """

    route: OpenAIRoute
    body: dict[str, Any]
    stream: bool = False
    cache_salt: str | None = None


class OpenAIReply(msgspec.Struct, frozen=True, kw_only=True):
    """A backend's answer: exactly one of a complete JSON object, SSE ``data`` payloads, or
    (``audio.speech``) the bytes of a file with their ``media_type``.

    :ivar body: the complete JSON reply.
    :ivar stream: an async iterator of SSE ``data`` payloads (JSON bytes, no ``[DONE]``, which
        the host adds); the host always closes it.
    :ivar content: a file's bytes (speech).
    :ivar media_type: the content's media type (``audio/wav``); only with ``content``.
    """

    body: dict[str, Any] | None = None
    stream: AsyncIterator[bytes] | None = None
    content: bytes | None = None
    media_type: str | None = None

    def __post_init__(self) -> None:
        carried = (self.body is not None) + (self.stream is not None) + (self.content is not None)
        if carried != 1:
            raise ValueError("an OpenAIReply carries exactly one of body, stream or content")
        if (self.content is None) != (self.media_type is None):
            raise ValueError("an OpenAIReply's content needs a media_type, and only content")
