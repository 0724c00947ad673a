"""Werk Image (text to IMAGE) and Werk Speech (text to AUDIO, as a Werk job polled to its end
with the node's progress bar moving through the job's stages)."""

from __future__ import annotations

import base64
import time
from typing import Any, ClassVar

from .base import CATEGORY, MAX_SEED, SERVER_INPUT, ModelNode, server_of
from .choices import model_choices
from .client import WerkNodeError, WerkServer
from .media import pngs_to_image, wav_to_audio
from .progress import Progress, stop_if_interrupted

__all__ = ["WerkImage", "WerkSpeech"]

# A job's stages in order (docs: "Jobs"); the bar moves one step per stage reached.
_STAGES = ("queued", "loading", "running", "encoding", "completed")
_POLL = 0.2
_JOB_TIMEOUT = 3600.0


class WerkImage(ModelNode):
    """``POST /v1/images/generations`` on a Werk image model → IMAGE (a batch of ``count``)."""

    CATEGORY = f"{CATEGORY}/Media"
    DESCRIPTION = "Generate images with a Werk (Diffusers) model."
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("image",)
    FUNCTION = "generate"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        side = {"default": 512, "min": 8, "max": 1024, "step": 8}
        return {
            "required": {
                "model": (model_choices().image, {"tooltip": "An image model Werk serves"}),
                "prompt": ("STRING", {"multiline": True, "default": ""}),
                "negative_prompt": ("STRING", {"multiline": True, "default": ""}),
                "width": ("INT", side),
                "height": ("INT", side),
                "steps": ("INT", {"default": 20, "min": 1, "max": 100}),
                "guidance_scale": ("FLOAT", {"default": 7.5, "min": 0.0, "max": 30.0, "step": 0.5}),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
                "count": ("INT", {"default": 1, "min": 1, "max": 4}),
            },
            "optional": dict(SERVER_INPUT),
        }

    def generate(
        self,
        model: str,
        prompt: str,
        negative_prompt: str,
        width: int,
        height: int,
        steps: int,
        guidance_scale: float,
        seed: int,
        count: int,
        server: WerkServer | None = None,
    ) -> tuple[Any]:
        body = {
            "model": model,
            "prompt": prompt,
            "negative_prompt": negative_prompt or None,
            "size": f"{width}x{height}",
            "steps": steps,
            "guidance_scale": guidance_scale,
            "seed": seed,
            "n": count,
            "response_format": "b64_json",
        }
        answer = server_of(server).request("POST", "/v1/images/generations", body)
        pngs = [base64.b64decode(item["b64_json"]) for item in answer.get("data", [])]
        if not pngs:
            raise WerkNodeError("bad_response", "the image answer carried no image")
        return (pngs_to_image(pngs),)


class WerkSpeech(ModelNode):
    """An ``audio.speech`` job (``POST /v1/jobs``), polled until it ends → AUDIO. ComfyUI's
    Cancel cancels the job too."""

    CATEGORY = f"{CATEGORY}/Media"
    DESCRIPTION = "Speak a text with a Werk speech model (a Werk job) → AUDIO."
    RETURN_TYPES = ("AUDIO",)
    RETURN_NAMES: ClassVar[tuple[str, ...]] = ("audio",)
    FUNCTION = "speak"

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (model_choices().speech, {"tooltip": "A speech model Werk serves"}),
                "text": ("STRING", {"multiline": True, "default": ""}),
                "voice": (
                    "STRING",
                    {"default": "", "tooltip": "A speaker of the model (optional)"},
                ),
                "seed": ("INT", {"default": 0, "min": 0, "max": MAX_SEED}),
            },
            "optional": dict(SERVER_INPUT),
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def speak(
        self,
        model: str,
        text: str,
        voice: str,
        seed: int,
        server: WerkServer | None = None,
        unique_id: str | None = None,
    ) -> tuple[dict[str, Any]]:
        werk = server_of(server)
        request: dict[str, Any] = {"model": model, "input": text, "seed": seed}
        if voice.strip():
            request["voice"] = voice.strip()
        job = werk.request("POST", "/v1/jobs", {"kind": "audio.speech", "request": request})
        job = _wait(werk, job, Progress(len(_STAGES) - 1, unique_id))
        raw, _ = werk.download(job["output"]["url"])
        return (wav_to_audio(raw),)


def _wait(werk: WerkServer, job: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """Poll ``GET /v1/jobs/{id}`` until the job ends; the record of a completed job."""
    path = f"/v1/jobs/{job['id']}"
    deadline = time.monotonic() + _JOB_TIMEOUT
    while True:
        status = job["status"]
        if status in _STAGES:
            progress.at(_STAGES.index(status))
        if status == "completed":
            return job
        if status in ("failed", "cancelled"):
            error = job.get("error") or {}
            raise WerkNodeError(
                str(error.get("code") or status),
                f"the speech job {job['id']} {status}: {error.get('message', status)}",
            )
        if time.monotonic() > deadline:
            werk.request("DELETE", path)
            raise WerkNodeError("timeout", f"the speech job {job['id']} did not end in an hour")
        stop_if_interrupted(lambda: werk.request("DELETE", path))
        time.sleep(_POLL)
        job = werk.request("GET", path)
