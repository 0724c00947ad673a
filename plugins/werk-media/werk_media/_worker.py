"""Werk's media companion worker. Run by the media python (never imported by Werk).

It speaks the host's companion-worker protocol (``werk/_companion/werk_companion_frames.py``,
found through ``WERK_COMPANION_FRAMES``; :mod:`werk.companion`): one request at a time over
stdio, one JSON object per line, transport version 1.

Operations: ``health`` (versions, pid, resident pipelines), ``capabilities`` (tasks this
environment can run: Diffusers text-to-image and image-to-image, VITS or Qwen3-TTS
text-to-speech, Transformers speech recognition and text classification; and ``features``:
whether qwen-tts is here and whether its 25 Hz voice-cloning path can work), ``probe-model``
(the task and pipeline class of a model directory), ``estimate`` (weight bytes on disk),
``execute`` (run a task), ``unload`` (drop one pipeline).
A frame of another transport version is refused (kind ``version``). The host ends the worker
after any error reply and never sends an ``execute`` twice; whatever the libraries print lands
in the worker's log, never in the protocol.

Loaded pipelines stay in an LRU of ``WERK_MEDIA_PIPELINE_CACHE_SIZE`` entries (default 1;
0 = nothing stays after a request). Evicting one drops every reference, runs
``gc.collect()`` and glibc's ``malloc_trim(0)``. Each entry's size is the bytes of its
parameters and buffers (the RSS change while loading is misleading: safetensors maps weights
lazily).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import gc
import importlib.metadata
import importlib.util
import io
import json
import os
import sys
import time
import wave
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from werk_companion_frames import LoadedLRU, RequestError, serve

TASK_TEXT_TO_IMAGE = "text-to-image"
TASK_IMAGE_TO_IMAGE = "image-to-image"  # an execute task on a text-to-image pipeline
MAX_UPLOAD_SIDE = 4096
TASK_TEXT_TO_SPEECH = "text-to-speech"
TASK_SPEECH_RECOGNITION = "automatic-speech-recognition"
TASK_TEXT_CLASSIFICATION = "text-classification"
TASKS = (
    TASK_TEXT_TO_IMAGE,
    TASK_IMAGE_TO_IMAGE,
    TASK_TEXT_TO_SPEECH,
    TASK_SPEECH_RECOGNITION,
    TASK_TEXT_CLASSIFICATION,
)
# Transformers architectures by task (config.json "architectures").
QWEN_ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
SPEECH_ARCHITECTURES = ("VitsModel", QWEN_ARCHITECTURE)
RECOGNITION_SUFFIXES = ("ForCTC", "ForSpeechSeq2Seq")
CLASSIFICATION_SUFFIX = "ForSequenceClassification"


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _module_bytes(loaded: Any) -> int:
    """Parameter and buffer bytes of every torch module a loaded entry holds (shared tensors
    once): a Diffusers pipeline's components, a Transformers pipeline's or a bare model."""
    import torch

    if hasattr(loaded, "components"):
        modules = list(loaded.components.values())
    elif isinstance(loaded, torch.nn.Module):
        modules = [loaded]
    else:  # a Transformers pipeline, or qwen-tts's wrapper (its codec sits beside the model)
        model = getattr(loaded, "model", None)
        codec = getattr(getattr(model, "speech_tokenizer", None), "model", None)
        modules = [model, codec]
    seen: set[int] = set()
    total = 0
    for component in modules:
        if not isinstance(component, torch.nn.Module):
            continue
        for tensor in [*component.parameters(), *component.buffers()]:
            key = tensor.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _task_of(path: Path) -> tuple[str, str]:
    index = path / "model_index.json"
    if index.is_file():
        try:
            name = str(json.loads(index.read_text(encoding="utf-8")).get("_class_name", ""))
        except (OSError, ValueError) as exc:
            raise RequestError("invalid", f"model_index.json is unreadable: {exc}") from None
        if name.endswith("Pipeline") and "Img2Img" not in name and "Inpaint" not in name:
            return TASK_TEXT_TO_IMAGE, name
        raise RequestError("unsupported", f"the Diffusers pipeline {name or '?'} is not supported")
    config = path / "config.json"
    if config.is_file():
        try:
            architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures")
        except (OSError, ValueError) as exc:
            raise RequestError("invalid", f"config.json is unreadable: {exc}") from None
        for name in architectures or []:
            if name in SPEECH_ARCHITECTURES:
                return TASK_TEXT_TO_SPEECH, name
            if name.endswith(RECOGNITION_SUFFIXES):
                return TASK_SPEECH_RECOGNITION, name
            if name.endswith(CLASSIFICATION_SUFFIX):
                return TASK_TEXT_CLASSIFICATION, name
        raise RequestError("unsupported", f"no supported task for architectures {architectures}")
    raise RequestError("unsupported", "neither a Diffusers nor a Transformers model directory")


def _load_qwen(path: str) -> Any:
    import _qwen_compat

    _qwen_compat.install()
    try:
        from qwen_tts import Qwen3TTSModel
    except ImportError:
        raise RequestError(
            "unsupported",
            "qwen-tts is not installed in this worker's environment: Qwen3-TTS models are "
            "served by backend qwen-tts (`werk backends install qwen-tts`)",
        ) from None
    return Qwen3TTSModel.from_pretrained(path, device_map="cpu")


def _load(path: str, task: str, name: str) -> Any:
    if name == QWEN_ARCHITECTURE:
        return _load_qwen(path)
    if task == TASK_TEXT_TO_IMAGE:
        from diffusers import DiffusionPipeline

        pipeline = DiffusionPipeline.from_pretrained(path, local_files_only=True)
        pipeline.set_progress_bar_config(disable=True)
        return pipeline
    if task == TASK_TEXT_TO_SPEECH:
        # The model itself: Transformers 5.17's text-to-audio pipeline fails on VITS tokenizer
        # output (BatchEncoding.to(dtype=...)).
        from transformers import AutoTokenizer, VitsModel

        model = VitsModel.from_pretrained(path, local_files_only=True).eval()
        return (AutoTokenizer.from_pretrained(path, local_files_only=True), model)
    from transformers import pipeline as transformers_pipeline

    return transformers_pipeline(task, model=path, device="cpu")


def _load_entry(path: str) -> tuple[Any, dict[str, Any]]:
    """One pipeline (or model) and what the host is told of it: task, class, bytes."""
    task, name = _task_of(Path(path))
    loaded = _load(path, task, name)
    held = loaded[1] if isinstance(loaded, tuple) else loaded
    return loaded, {"task": task, "pipeline": name, "bytes": _module_bytes(held)}


Pipelines = LoadedLRU
"""The LRU of loaded pipelines, by model directory (the host's :class:`LoadedLRU`)."""


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "diffusers", "transformers", "qwen-tts"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def _features() -> dict[str, dict[str, str]]:
    """What this environment can do beyond its tasks (``capabilities``)."""
    if importlib.util.find_spec("qwen_tts") is None:
        why = "qwen-tts is not installed here (backend qwen-tts has its own environment)"
        return {
            "qwen_custom_voice": {"status": "unavailable", "reason": why},
            "qwen_voice_cloning": {"status": "unavailable", "reason": why},
        }
    import _qwen_compat

    problem = _qwen_compat.install()
    why = "no Werk route takes reference audio"
    if problem:
        why += f", and its 25 Hz path needs torchaudio, which does not load here ({problem})"
    cloning = {"status": "unsupported", "reason": why}
    return {
        "qwen_custom_voice": {"status": "supported", "reason": "the 12 Hz path"},
        "qwen_voice_cloning": cloning,
    }


def _uploaded_image(args: dict[str, Any]) -> Any:
    """The uploaded PNG/JPEG as RGB, resized to the requested size."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(base64.b64decode(str(args["image_b64"]))))
        if max(image.size) > MAX_UPLOAD_SIDE:
            raise RequestError("invalid", f"'image' sides must be at most {MAX_UPLOAD_SIDE} px")
        image = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RequestError("invalid", f"'image' is not a readable PNG or JPEG: {exc}") from None
    return image.resize((int(args["width"]), int(args["height"])))


def _text_to_image(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    import torch

    pipeline = pipelines.get(str(args["path"]))
    seed = args.get("seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    generator = torch.Generator("cpu").manual_seed(int(seed))
    common = {
        "prompt": str(args["prompt"]),
        "negative_prompt": args.get("negative_prompt"),
        "num_inference_steps": int(args["steps"]),
        "guidance_scale": float(args["guidance_scale"]),
        "num_images_per_prompt": int(args.get("n", 1)),
        "generator": generator,
        "output_type": "pil",
    }
    started = time.monotonic()
    if args.get("task") == TASK_IMAGE_TO_IMAGE:
        from diffusers import AutoPipelineForImage2Image

        try:  # the same components, shared: nothing is loaded twice
            editor = AutoPipelineForImage2Image.from_pipe(pipeline)
        except ValueError as exc:
            raise RequestError(
                "unsupported", f"{type(pipeline).__name__} has no image-to-image form: {exc}"
            ) from None
        editor.set_progress_bar_config(disable=True)
        result = editor(image=_uploaded_image(args), strength=float(args["strength"]), **common)
    else:
        result = pipeline(width=int(args["width"]), height=int(args["height"]), **common)
    images = []
    for image in result.images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return {"images": images, "seed": int(seed), "seconds": time.monotonic() - started}


def _wav(waveform: Any, rate: int) -> bytes:
    """16-bit PCM mono WAV of a float waveform, scaled to its peak."""
    import numpy as np

    peak = float(np.abs(waveform).max()) or 1.0
    pcm = (np.clip(waveform / peak, -1.0, 1.0) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def _qwen_speech(model: Any, args: dict[str, Any]) -> tuple[Any, int]:
    """qwen-tts's CustomVoice generation: ``voice`` names one of the model's speakers (default:
    the first), ``instructions`` becomes its instruction text."""
    if float(args.get("speed") or 1.0) != 1.0:
        raise RequestError("invalid", "Qwen3-TTS has no speed control: leave 'speed' at 1.0")
    speakers = sorted(str(name) for name in model.get_supported_speakers() or [])
    voice = args.get("voice")
    if voice is None:
        if not speakers:
            raise RequestError("invalid", "this Qwen3-TTS model names no speakers")
        voice = speakers[0]
    elif str(voice).lower() not in speakers:
        raise RequestError(
            "invalid", f"voice {voice!r} is not one of this model's speakers: {speakers}"
        )
    wavs, rate = model.generate_custom_voice(
        text=str(args["input"]), speaker=str(voice), instruct=args.get("instructions")
    )
    return wavs[0], int(rate)


def _vits_speech(loaded: tuple[Any, Any], args: dict[str, Any]) -> tuple[Any, int]:
    import torch

    if args.get("instructions"):
        raise RequestError("invalid", "this VITS voice takes no 'instructions'")
    tokenizer, model = loaded
    model.speaking_rate = float(args.get("speed") or 1.0)
    inputs = tokenizer(str(args["input"]), return_tensors="pt")
    if inputs["input_ids"].shape[-1] == 0:
        raise RequestError("invalid", "the input has no characters this voice can speak")
    with torch.no_grad():
        waveform = model(**inputs).waveform[0].numpy()
    return waveform, int(model.config.sampling_rate)


def _text_to_speech(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    import torch

    loaded = pipelines.get(str(args["path"]))
    seed = args.get("seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    torch.manual_seed(int(seed))
    started = time.monotonic()
    if isinstance(loaded, tuple):
        waveform, rate = _vits_speech(loaded, args)
    else:
        waveform, rate = _qwen_speech(loaded, args)
    return {
        "audio": base64.b64encode(_wav(waveform, rate)).decode("ascii"),
        "content_type": "audio/wav",
        "seed": int(seed),
        "seconds": time.monotonic() - started,
    }


def _read_wav(data: bytes) -> tuple[Any, int]:
    """Mono float32 samples and the rate of a 16-bit PCM WAV."""
    import numpy as np

    try:
        with wave.open(io.BytesIO(data), "rb") as source:
            channels, width, rate = (
                source.getnchannels(),
                source.getsampwidth(),
                source.getframerate(),
            )
            frames = source.readframes(source.getnframes())
    except (wave.Error, EOFError) as exc:
        raise RequestError("invalid", f"the audio is not a readable WAV file: {exc}") from None
    if width != 2:
        raise RequestError("invalid", "the WAV file must hold 16-bit PCM samples")
    samples = np.frombuffer(frames, dtype="<i2").astype("float32") / 32768.0
    if channels > 1:
        samples = samples.reshape(-1, channels).mean(axis=1)
    return samples, rate


def _speech_recognition(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    recognizer = pipelines.get(str(args["path"]))
    samples, rate = _read_wav(base64.b64decode(str(args["audio_b64"])))
    wanted = int(getattr(recognizer.feature_extractor, "sampling_rate", rate))
    if rate != wanted and len(samples):  # linear resampling to the model's rate
        positions = np.linspace(0, len(samples) - 1, int(len(samples) * wanted / rate))
        samples = np.interp(positions, np.arange(len(samples)), samples).astype("float32")
    started = time.monotonic()
    result = recognizer({"raw": samples, "sampling_rate": wanted})
    return {"text": str(result.get("text", "")), "seconds": time.monotonic() - started}


def _text_classification(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    classifier = pipelines.get(str(args["path"]))
    texts = [str(text) for text in args["texts"]]
    started = time.monotonic()
    found = classifier(texts, top_k=int(args.get("top_k") or 1), truncation=True)
    labelled = [
        {
            "index": index,
            "labels": [{"label": str(x["label"]), "score": float(x["score"])} for x in labels],
        }
        for index, labels in enumerate(found)
    ]
    return {"data": labelled, "seconds": time.monotonic() - started}


EXECUTORS = {
    TASK_TEXT_TO_IMAGE: _text_to_image,
    TASK_IMAGE_TO_IMAGE: _text_to_image,
    TASK_TEXT_TO_SPEECH: _text_to_speech,
    TASK_SPEECH_RECOGNITION: _speech_recognition,
    TASK_TEXT_CLASSIFICATION: _text_classification,
}


def _handle(pipelines: Pipelines, op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "health":
        return {"pid": os.getpid(), "versions": _versions(), "resident": pipelines.resident()}
    if op == "capabilities":
        return {"tasks": list(TASKS), "cache_size": pipelines.capacity, "features": _features()}
    if op == "probe-model":
        task, name = _task_of(Path(str(args["path"])))
        return {"task": task, "pipeline": name}
    if op == "estimate":
        root = Path(str(args["path"]))
        size = sum(p.stat().st_size for p in root.rglob("*.safetensors") if p.is_file())
        return {"bytes": size}
    if op == "unload":
        return {"unloaded": pipelines.drop(str(args["path"])), "resident": pipelines.resident()}
    if op == "execute":
        executor = EXECUTORS.get(str(args.get("task")))
        if executor is None:
            raise RequestError("unsupported", f"task {args.get('task')!r} is not supported")
        try:
            result = executor(pipelines, args)
        finally:
            pipelines.after_request()
        result["resident"] = pipelines.resident()
        return result
    raise RequestError("invalid", f"unknown operation {op!r}")


def main() -> None:
    capacity = int(os.environ.get("WERK_MEDIA_PIPELINE_CACHE_SIZE", "1"))
    pipelines = Pipelines(capacity, _load_entry, _trim)
    serve(lambda op, args: _handle(pipelines, op, args))


if __name__ == "__main__":
    main()
