"""Werk's media companion worker. Run by the media python (never imported by Werk).

One request at a time over stdio, one JSON object per line (transport version 1):

* request ``{"v": 1, "id": "r1", "op": OP, "args": {...}}``
* reply ``{"v": 1, "id": "r1", "ok": true, "result": {...}}`` or
  ``{"v": 1, "id": "r1", "ok": false, "error": {"kind": KIND, "message": TEXT}}``

Operations: ``health`` (versions, pid, resident pipelines), ``capabilities`` (tasks this
environment can run: Diffusers text-to-image, VITS text-to-speech, Transformers speech
recognition), ``probe-model`` (the task and pipeline class of a model directory),
``estimate`` (weight bytes on disk), ``execute`` (run a task), ``unload`` (drop one pipeline).
A frame of another transport version is refused (kind ``version``). The host ends the worker
after any error reply and never sends an ``execute`` twice.

Protocol frames go to the original stdout; file descriptor 1 is pointed at stderr first, so
whatever the libraries print lands in the worker's log, never in the protocol.

Loaded pipelines stay in an LRU of ``WERK_MEDIA_PIPELINE_CACHE_SIZE`` entries (default 1;
0 = nothing stays after a request). Evicting one drops every reference, runs
``gc.collect()`` and glibc's ``malloc_trim(0)``. Each entry's size is the bytes of its
parameters and buffers (the RSS change while loading is misleading: safetensors maps weights
lazily).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import ctypes
import gc
import io
import json
import os
import sys
import time
import wave
from pathlib import Path
from typing import Any

TRANSPORT_VERSION = 1
TASK_TEXT_TO_IMAGE = "text-to-image"
TASK_TEXT_TO_SPEECH = "text-to-speech"
TASK_SPEECH_RECOGNITION = "automatic-speech-recognition"
TASKS = (TASK_TEXT_TO_IMAGE, TASK_TEXT_TO_SPEECH, TASK_SPEECH_RECOGNITION)
# Transformers architectures by task (config.json "architectures").
SPEECH_ARCHITECTURES = ("VitsModel",)
RECOGNITION_SUFFIXES = ("ForCTC", "ForSpeechSeq2Seq")


class RequestError(Exception):
    """A request this worker cannot serve (reported, then the host ends the worker)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _protocol_stream() -> io.TextIOWrapper:
    frames = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return io.TextIOWrapper(os.fdopen(frames, "wb", buffering=0), encoding="utf-8", newline="\n")


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
    else:
        modules = [getattr(loaded, "model", None)]
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
        raise RequestError("unsupported", f"no supported task for architectures {architectures}")
    raise RequestError("unsupported", "neither a Diffusers nor a Transformers model directory")


def _load(path: str, task: str) -> Any:
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


class Pipelines:
    """The LRU of loaded pipelines, by model directory."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: collections.OrderedDict[str, tuple[str, Any, int]] = (
            collections.OrderedDict()
        )

    def resident(self) -> list[dict[str, Any]]:
        return [
            {"path": path, "task": task, "bytes": size}
            for path, (task, _, size) in self._entries.items()
        ]

    def drop(self, path: str) -> bool:
        entry = self._entries.pop(path, None)
        if entry is None:
            return False
        del entry
        _trim()
        return True

    def get(self, path: str) -> Any:
        if path in self._entries:
            self._entries.move_to_end(path)
            return self._entries[path][1]
        while self._entries and len(self._entries) >= max(self.capacity, 1):
            self.drop(next(iter(self._entries)))  # evict before loading: lower peak memory
        task, _ = _task_of(Path(path))
        loaded = _load(path, task)
        held = loaded[1] if isinstance(loaded, tuple) else loaded
        self._entries[path] = (task, loaded, _module_bytes(held))
        return loaded

    def after_request(self) -> None:
        while len(self._entries) > self.capacity:
            self.drop(next(iter(self._entries)))


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in ("torch", "diffusers", "transformers"):
        try:
            found[name] = str(__import__(name).__version__)
        except ImportError:
            continue
    return found


def _text_to_image(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    import torch

    pipeline = pipelines.get(str(args["path"]))
    seed = args.get("seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    generator = torch.Generator("cpu").manual_seed(int(seed))
    started = time.monotonic()
    result = pipeline(
        prompt=str(args["prompt"]),
        negative_prompt=args.get("negative_prompt"),
        width=int(args["width"]),
        height=int(args["height"]),
        num_inference_steps=int(args["steps"]),
        guidance_scale=float(args["guidance_scale"]),
        num_images_per_prompt=int(args.get("n", 1)),
        generator=generator,
        output_type="pil",
    )
    images = []
    for image in result.images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append(base64.b64encode(buffer.getvalue()).decode("ascii"))
    return {"images": images, "seed": int(seed), "seconds": time.monotonic() - started}


def _text_to_speech(pipelines: Pipelines, args: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import torch

    tokenizer, model = pipelines.get(str(args["path"]))
    seed = args.get("seed")
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "big")
    torch.manual_seed(int(seed))
    model.speaking_rate = float(args.get("speed") or 1.0)
    started = time.monotonic()
    inputs = tokenizer(str(args["input"]), return_tensors="pt")
    if inputs["input_ids"].shape[-1] == 0:
        raise RequestError("invalid", "the input has no characters this voice can speak")
    with torch.no_grad():
        waveform = model(**inputs).waveform[0].numpy()
    peak = float(np.abs(waveform).max()) or 1.0
    pcm = (np.clip(waveform / peak, -1.0, 1.0) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(int(model.config.sampling_rate))
        out.writeframes(pcm.tobytes())
    return {
        "audio": base64.b64encode(buffer.getvalue()).decode("ascii"),
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


EXECUTORS = {
    TASK_TEXT_TO_IMAGE: _text_to_image,
    TASK_TEXT_TO_SPEECH: _text_to_speech,
    TASK_SPEECH_RECOGNITION: _speech_recognition,
}


def _handle(pipelines: Pipelines, op: str, args: dict[str, Any]) -> dict[str, Any]:
    if op == "health":
        return {"pid": os.getpid(), "versions": _versions(), "resident": pipelines.resident()}
    if op == "capabilities":
        return {"tasks": list(TASKS), "cache_size": pipelines.capacity}
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


def _failure(request_id: Any, kind: str, message: str) -> dict[str, Any]:
    error = {"kind": kind, "message": message}
    return {"v": TRANSPORT_VERSION, "id": request_id, "ok": False, "error": error}


def main() -> None:
    frames = _protocol_stream()
    capacity = int(os.environ.get("WERK_MEDIA_PIPELINE_CACHE_SIZE", "1"))
    pipelines = Pipelines(max(capacity, 0))
    for line in sys.stdin:
        if not line.strip():
            continue
        request_id: Any = None
        try:
            frame = json.loads(line)
            request_id = frame.get("id")
            if frame.get("v") != TRANSPORT_VERSION:
                raise RequestError("version", f"transport version {frame.get('v')!r} is not 1")
            reply: dict[str, Any] = {
                "v": TRANSPORT_VERSION,
                "id": request_id,
                "ok": True,
                "result": _handle(pipelines, str(frame.get("op")), dict(frame.get("args") or {})),
            }
        except RequestError as exc:
            reply = _failure(request_id, exc.kind, str(exc))
        except Exception as exc:  # a failed pipeline: reported, then the host ends this worker
            print(f"request {request_id} failed: {exc!r}", file=sys.stderr, flush=True)
            reply = _failure(request_id, "failed", f"{type(exc).__name__}: {exc}")
        frames.write(json.dumps(reply) + "\n")
        frames.flush()


if __name__ == "__main__":
    main()
