"""Werk hook implementations for the media workers: backends ``media`` and ``qwen-tts``.

``werk backends install media`` builds the generic worker's environment (:mod:`.environment`),
``werk models create-demo --kind image|tts|asr|classify`` writes tiny models with it, and backend
``media`` serves ``POST /v1/images/generations`` (Diffusers), ``/v1/audio/speech`` (VITS),
``/v1/audio/transcriptions`` (Transformers speech recognition) and ``/v1/classifications``
(Transformers text classification) through one companion worker
process (:mod:`.worker`, protocol in ``_worker.py``) that keeps an LRU of loaded pipelines.
Backend ``qwen-tts`` is the managed Qwen3-TTS path: ``werk backends install qwen-tts``,
``werk models create-demo --kind qwen-tts``, ``/v1/audio/speech`` through a second, separate
worker (same program, the qwen-tts environment's python) with its own LRU.

Rows, per backend: ``runtime.model_residency`` is ``supported`` while that backend's worker
lives (the reason says whether the model's pipeline is resident now, and the LRU's capacity;
for qwen-tts also why voice cloning is unsupported), ``unavailable`` before it starts or after
it ended (the reason names the install command when the environment is missing). Pipelines
have no text KV state: the plugin implements no state, prefill/decode or expert hook, so the
host reports those rows ``unsupported`` (backend contract 1.1).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from werk import (
    BackendDescriptor,
    CapabilityContext,
    CapabilityReport,
    CompanionBackend,
    DemoModel,
    EnvironmentSpec,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    RuntimeEnded,
    hookimpl,
)

from .environment import MediaPython, locate, locate_qwen

if TYPE_CHECKING:
    from .worker import MediaWorker

BACKEND = "media"
QWEN_BACKEND = "qwen-tts"
QWEN_ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
LOCATORS: dict[str, Callable[[], MediaPython]] = {BACKEND: locate, QWEN_BACKEND: locate_qwen}


@dataclass(eq=False)
class MediaHandle:
    """A media model's runtime: the shared worker and the model's pipeline directory."""

    worker: MediaWorker
    path: Path
    task: str


def _start_worker(kind: str) -> Callable[[], Awaitable[MediaWorker]]:
    async def start() -> MediaWorker:
        from .worker import MediaWorker

        return await MediaWorker.start(LOCATORS[kind](), kind)

    return start


def _locator(kind: str) -> Callable[[], MediaPython]:
    return lambda: LOCATORS[kind]()  # read at call time (tests replace LOCATORS)


def _cloning_note(worker: MediaWorker) -> str:
    cloning = worker.features.get("qwen_voice_cloning")
    if worker.kind != QWEN_BACKEND or not cloning:
        return ""
    return f"; voice cloning {cloning.get('status')}: {cloning.get('reason')}"


SHARED: dict[str, CompanionBackend[MediaWorker]] = {
    kind: CompanionBackend(
        kind,
        _start_worker(kind),
        _locator(kind),
        entry="pipeline",
        capacity_setting="WERK_MEDIA_PIPELINE_CACHE_SIZE",
        note=_cloning_note,
    )
    for kind in (BACKEND, QWEN_BACKEND)
}
"""Per backend, its worker of this Werk process and the runtimes that use it."""


def _pipeline_dir(spec: ModelSpec) -> Path:
    """The model's directory: a Diffusers pipeline's (``model_index.json``), else the top-most
    ``config.json``'s (a Transformers model)."""
    for path in spec.files:
        if path.name == "model_index.json":
            return path.parent
    configs = sorted((p for p in spec.files if p.name == "config.json"), key=lambda p: len(p.parts))
    if configs:
        return configs[0].parent
    raise InvalidRequest(
        f"model {spec.id!r} is neither a Diffusers pipeline (model_index.json) nor a "
        "Transformers model (config.json)"
    )


async def start_runtime(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: the backend's worker (started if needed) probes the
    model; a Qwen3-TTS model belongs to backend qwen-tts, every other one to media."""
    path = _pipeline_dir(spec)
    shared = SHARED[spec.backend]
    worker = await shared.running()
    probe = await worker.request("probe-model", {"path": str(path)})
    is_qwen = probe.get("pipeline") == QWEN_ARCHITECTURE
    if is_qwen != (spec.backend == QWEN_BACKEND):
        right = QWEN_BACKEND if is_qwen else BACKEND
        raise InvalidRequest(
            f"model {spec.id!r} ({probe.get('pipeline')}) is served by backend {right!r}, not "
            f"{spec.backend!r}: import it again with --backend {right}"
        )
    runtime = Runtime(
        backend=spec.backend,
        model=spec,
        generation=worker.generation,
        handle=MediaHandle(worker=worker, path=path, task=str(probe["task"])),
    )
    return shared.attach(runtime)


async def stop_runtime(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: drop the model's pipeline; the last runtime ends the worker."""
    handle = runtime.handle
    path = str(handle.path) if isinstance(handle, MediaHandle) else ""
    await SHARED[runtime.backend].detach(runtime, {"path": path})


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("diffusers", "transformers"),
            description="a resident Diffusers/Transformers media worker",
            start=start_runtime,
            stop=stop_runtime,
            routes=(
                "images.generations",
                "images.edits",
                "audio.speech",
                "audio.transcriptions",
                "classifications",
            ),
        )
    )
    register(
        BackendDescriptor(
            name=QWEN_BACKEND,
            formats=("qwen3-tts",),
            description="a resident Qwen3-TTS worker (qwen-tts, its own environment)",
            start=start_runtime,
            stop=stop_runtime,
            routes=("audio.speech",),
        )
    )


@hookimpl
def werk_backend_environments() -> list[EnvironmentSpec]:
    """``werk backends install media``: torch (CPU build here), Diffusers, Transformers;
    ``werk backends install qwen-tts``: qwen-tts 0.1.1 and Transformers 4.57.3."""
    from .environment import environment_spec, qwen_environment_spec

    return [environment_spec(), qwen_environment_spec()]


@hookimpl
def werk_demo_models() -> list[DemoModel]:
    """``werk models create-demo --kind image|tts|asr|classify|qwen-tts``: tiny models."""
    from .demos import DEMOS

    return list(DEMOS)


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    if context.backend not in SHARED:
        return []
    loaded = lambda runtime: str(getattr(runtime.handle, "path", ""))  # noqa: E731
    return [SHARED[context.backend].residency(context, loaded)]


ROUTE_TASKS = {
    "images.generations": "text-to-image",
    "images.edits": "text-to-image",  # image to image, from the same pipeline's components
    "audio.speech": "text-to-speech",
    "audio.transcriptions": "automatic-speech-recognition",
    "classifications": "text-classification",
}


def _arguments(call: OpenAICall, handle: MediaHandle) -> dict[str, object]:
    body = call.body
    common: dict[str, object] = {"task": handle.task, "path": str(handle.path)}
    if call.route in ("images.generations", "images.edits"):
        width, height = (int(side) for side in str(body["size"]).split("x"))
        if call.route == "images.edits":
            common |= {
                "task": "image-to-image",
                "image_b64": body["image_b64"],
                "strength": body["strength"],
            }
        return common | {
            "prompt": body["prompt"],
            "negative_prompt": body.get("negative_prompt"),
            "n": body["n"],
            "width": width,
            "height": height,
            "steps": body["steps"],
            "guidance_scale": body["guidance_scale"],
            "seed": body.get("seed"),
        }
    if call.route == "audio.speech":
        return common | {
            "input": body["input"],
            "voice": body.get("voice"),
            "instructions": body.get("instructions"),
            "speed": body["speed"],
            "seed": body.get("seed"),
        }
    if call.route == "classifications":
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return common | {"texts": texts, "top_k": body["top_k"]}
    return common | {"audio_b64": body["audio_b64"]}


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | None:
    """The media routes through the worker (the host validated every bound)."""
    handle = runtime.handle
    if not isinstance(handle, MediaHandle) or call.route not in ROUTE_TASKS:
        return None
    if ROUTE_TASKS[call.route] != handle.task:
        raise InvalidRequest(
            f"model {runtime.model.id!r} serves {handle.task}; "
            f"/v1/{call.route.replace('.', '/')} needs a {ROUTE_TASKS[call.route]} model"
        )
    if not handle.worker.alive():
        raise RuntimeEnded("the media worker ended before this request reached it")
    result = await handle.worker.request("execute", _arguments(call, handle))
    if call.route == "audio.speech":
        audio = base64.b64decode(str(result["audio"]))
        return OpenAIReply(content=audio, media_type=str(result["content_type"]))
    if call.route == "audio.transcriptions":
        return OpenAIReply(body={"text": str(result.get("text", ""))})
    if call.route == "classifications":
        data = result.get("data", [])
        return OpenAIReply(body={"object": "list", "model": runtime.model.id, "data": data})
    images = [{"b64_json": str(image)} for image in result.get("images", [])]
    return OpenAIReply(body={"created": int(time.time()), "data": images})
