"""OpenAI-style media requests that Werk validates before any backend sees them.

``POST /v1/images/generations`` (OpenAI's Images API shape, plus Werk's ``seed``, ``steps``,
``guidance_scale`` and ``negative_prompt``). Every bound is checked here, so a backend receives
only requests it can run: prompt length, image count, size, steps.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from .base import Request
from .errors import InvalidRequest, Unsupported

__all__ = [
    "IMAGE_SIDE_MAX",
    "IMAGE_SIDE_MIN",
    "IMAGE_SIZE_PATTERN",
    "MAX_AUDIO_BYTES",
    "MAX_AUDIO_SECONDS",
    "MAX_CLASSIFICATION_INPUTS",
    "MAX_IMAGE_UPLOAD_BYTES",
    "MAX_PROMPT_CHARS",
    "MAX_SPEECH_CHARS",
    "ClassificationRequest",
    "ImageEditRequest",
    "ImageGenerationRequest",
    "SpeechRequest",
    "TranscriptionRequest",
]

MAX_PROMPT_CHARS = 4000
IMAGE_SIDE_MIN, IMAGE_SIDE_MAX = 8, 1024
MAX_IMAGES = 4
MAX_STEPS = 100
MAX_SEED = 2**32 - 1
MAX_SPEECH_CHARS = 4096
MAX_AUDIO_BYTES = 25 * 1024 * 1024
MAX_AUDIO_SECONDS = 600
MAX_CLASSIFICATION_INPUTS = 32
MAX_IMAGE_UPLOAD_BYTES = 16 * 1024 * 1024
MAX_LABELS = 100


_SIDES = "|".join(str(side) for side in range(IMAGE_SIDE_MIN, IMAGE_SIDE_MAX + 1, 8))
IMAGE_SIZE_PATTERN = f"^(?:{_SIDES})x(?:{_SIDES})$"
"""The ``size`` values :func:`image_dimensions` accepts, as a regular expression (for the
published OpenAPI document)."""


def image_dimensions(size: str) -> tuple[int, int]:
    """``(width, height)`` of a ``WIDTHxHEIGHT`` size; ``InvalidRequest`` when out of bounds."""
    width_text, sep, height_text = size.partition("x")
    if not sep or not width_text.isdigit() or not height_text.isdigit():
        raise InvalidRequest(f"'size' must look like 512x512, not {size!r}")
    width, height = int(width_text), int(height_text)
    for side in (width, height):
        if not IMAGE_SIDE_MIN <= side <= IMAGE_SIDE_MAX or side % 8:
            raise InvalidRequest(
                f"'size' sides must be multiples of 8 in {IMAGE_SIDE_MIN}..{IMAGE_SIDE_MAX}"
            )
    return width, height


class _ImageRequest(Request, frozen=True, kw_only=True):
    """The members image generations and edits share (their bounds are checked here).

    :ivar size: ``WIDTHxHEIGHT``, each a multiple of 8 in 8..1024 (default ``512x512``).
    :ivar response_format: ``b64_json`` (the PNG inline), or ``url``: each image is kept as a
        finished job's output and answered as ``{"url": "/v1/outputs/…"}`` (relative to the
        server; private to the caller's API key).
    :ivar seed: makes the output reproducible (same model, same request, same bytes).
    :ivar steps: denoising steps (default 20).
    """

    model: str
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PROMPT_CHARS)]
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_IMAGES)] = 1
    size: str = "512x512"
    response_format: Literal["b64_json", "url"] = "b64_json"
    seed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)] | None = None
    steps: Annotated[int, msgspec.Meta(ge=1, le=MAX_STEPS)] = 20
    guidance_scale: Annotated[float, msgspec.Meta(ge=0.0, le=30.0)] = 7.5
    negative_prompt: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)] | None = None
    user: Annotated[str, msgspec.Meta(max_length=256)] | None = None

    def dimensions(self) -> tuple[int, int]:
        """``(width, height)`` from :attr:`size`; ``InvalidRequest`` when out of bounds."""
        return image_dimensions(self.size)

    def validate(self) -> None:
        self.dimensions()


class ImageGenerationRequest(_ImageRequest, frozen=True, kw_only=True):
    """``POST /v1/images/generations`` (members: see :class:`_ImageRequest`)."""

    as_job: bool = msgspec.field(default=False, name="async")
    """``"async": true``: answer ``202`` with a durable job instead of waiting (then ``n`` 1)."""


class ImageEditRequest(_ImageRequest, frozen=True, kw_only=True):
    """``POST /v1/images/edits`` (multipart, OpenAI's shape): the form's fields besides
    ``image`` (a PNG or JPEG, at most 16 MiB). Image to image: the pipeline starts from the
    uploaded image, resized to ``size``, noised by ``strength``.

    :ivar strength: how far from the image the result may go, 0 < strength <= 1 (default 0.8).
    """

    strength: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.8


class SpeechRequest(Request, frozen=True, kw_only=True):
    """``POST /v1/audio/speech`` (OpenAI's shape; the answer is the audio itself).

    :ivar response_format: ``wav`` (16-bit PCM); OpenAI's other formats are not offered.
    :ivar seed: makes the audio reproducible (Werk's addition).
    """

    model: str
    input: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SPEECH_CHARS)]
    voice: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    instructions: Annotated[str, msgspec.Meta(max_length=MAX_SPEECH_CHARS)] | None = None
    """How to speak (OpenAI's field; Qwen3-TTS takes it as its instruction text)."""
    response_format: Literal["wav", "mp3", "opus", "aac", "flac", "pcm"] = "wav"
    speed: Annotated[float, msgspec.Meta(ge=0.25, le=4.0)] = 1.0
    seed: Annotated[int, msgspec.Meta(ge=0, le=MAX_SEED)] | None = None
    as_job: bool = msgspec.field(default=False, name="async")
    """``"async": true``: answer ``202`` with a durable job whose output is the audio."""

    def validate(self) -> None:
        if self.response_format != "wav":
            raise Unsupported(
                f"'response_format' {self.response_format!r} is not offered; use 'wav'"
            )


class TranscriptionRequest(Request, frozen=True, kw_only=True):
    """``POST /v1/audio/transcriptions`` (multipart form, as OpenAI's): the form's fields
    besides ``file``; the file must be a WAV of 16-bit PCM, at most 25 MiB and 600 s."""

    model: str
    language: Annotated[str, msgspec.Meta(max_length=16)] | None = None
    prompt: Annotated[str, msgspec.Meta(max_length=MAX_PROMPT_CHARS)] | None = None
    response_format: Literal["json", "text"] = "json"
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None


ClassificationText = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_PROMPT_CHARS)]


class ClassificationRequest(Request, frozen=True, kw_only=True):
    """``POST /v1/classifications`` (Werk's own route; OpenAI has none for this): label each
    text with a text-classification model.

    :ivar input: one text, or a list of 1..32 texts (each 1..4000 characters).
    :ivar top_k: how many labels to return per text, best first (1..100, default 1).
    """

    model: str
    input: (
        ClassificationText
        | Annotated[
            list[ClassificationText],
            msgspec.Meta(min_length=1, max_length=MAX_CLASSIFICATION_INPUTS),
        ]
    )
    top_k: Annotated[int, msgspec.Meta(ge=1, le=MAX_LABELS)] = 1

    def validate(self) -> None:
        """Every bound is in the type."""

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)
