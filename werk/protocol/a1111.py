"""AUTOMATIC1111's ``/sdapi/v1`` request and response shapes, as Werk serves them.

Read from AUTOMATIC1111/stable-diffusion-webui 1.10 (``modules/api/models.py``, ``api.py``):
its request models are pydantic models whose **unknown keys are ignored** — clients send
``alwayson_scripts``, ``hr_*``, ``firstphase_*``, ``sampler_index``, ``override_settings`` and
more — so these Structs ignore unknown fields too (unlike Werk's own protocol, which refuses
them). The defaults are A1111's: 512×512, 50 steps, CFG 7, seed -1 (random), batch 1 × 1
iteration. Werk's bounds (sides multiples of 8 in 8..1024, 1..100 steps, at most 4 images per
request) are checked by :meth:`Txt2Img.check` and answered as typed errors.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .errors import InvalidRequest
from .media import IMAGE_SIDE_MAX, IMAGE_SIDE_MIN, MAX_IMAGES, MAX_PROMPT_CHARS, MAX_SEED, MAX_STEPS

__all__ = [
    "ImageResult",
    "Img2Img",
    "Progress",
    "ProgressState",
    "SdModel",
    "Txt2Img",
]


class Txt2Img(msgspec.Struct, kw_only=True):
    """``POST /sdapi/v1/txt2img`` (the members Werk honours; every other key is ignored)."""

    prompt: str = ""
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = 50
    cfg_scale: float = 7.0
    seed: int = -1
    batch_size: int = 1
    n_iter: int = 1
    sampler_name: str | None = None
    sampler_index: str | None = None
    scheduler: str | None = None
    override_settings: dict[str, Any] | None = None
    send_images: bool = True
    save_images: bool = False

    def count(self) -> int:
        return self.batch_size * self.n_iter

    def check(self) -> None:
        """Werk's bounds, as typed errors naming the field."""
        if len(self.prompt) > MAX_PROMPT_CHARS or len(self.negative_prompt) > MAX_PROMPT_CHARS:
            raise InvalidRequest(f"prompts take at most {MAX_PROMPT_CHARS} characters")
        for name in ("width", "height"):
            side = getattr(self, name)
            if not IMAGE_SIDE_MIN <= side <= IMAGE_SIDE_MAX or side % 8:
                raise InvalidRequest(
                    f"'{name}' must be a multiple of 8 in {IMAGE_SIDE_MIN}..{IMAGE_SIDE_MAX}",
                    param=name,
                )
        if not 1 <= self.steps <= MAX_STEPS:
            raise InvalidRequest(f"'steps' must be in 1..{MAX_STEPS}", param="steps")
        if not 0.0 <= self.cfg_scale <= 30.0:
            raise InvalidRequest("'cfg_scale' must be in 0..30", param="cfg_scale")
        if self.batch_size < 1 or self.n_iter < 1 or self.count() > MAX_IMAGES:
            raise InvalidRequest(
                f"'batch_size' × 'n_iter' must be 1..{MAX_IMAGES} images", param="batch_size"
            )
        if not -1 <= self.seed <= MAX_SEED:
            raise InvalidRequest(f"'seed' must be -1 (random) or 0..{MAX_SEED}", param="seed")


class Img2Img(Txt2Img, kw_only=True):
    """``POST /sdapi/v1/img2img``: :class:`Txt2Img` and the starting image.

    :ivar init_images: base64 PNG/JPEG, raw or as a ``data:image/…;base64,`` URL; the first one
        is used (A1111 uses the first too, more only for batches of different inputs).
    :ivar denoising_strength: how far from the image the result may go (A1111's default 0.75).
    """

    init_images: list[str] = msgspec.field(default_factory=list)
    denoising_strength: float = 0.75
    mask: str | None = None

    def check(self) -> None:
        super().check()
        if not self.init_images:
            raise InvalidRequest("'init_images' needs one image", param="init_images")
        if self.mask:
            raise InvalidRequest("'mask' (inpainting) is not offered", param="mask")
        if not 0.0 < self.denoising_strength <= 1.0:
            raise InvalidRequest(
                "'denoising_strength' must be in (0, 1]", param="denoising_strength"
            )


class ImageResult(msgspec.Struct, kw_only=True):
    """The answer of txt2img and img2img: the PNGs (base64), the request with its defaults, and
    ``info``, a JSON *string* (A1111's shape) with the seeds and settings used."""

    images: list[str]
    parameters: dict[str, Any]
    info: str


class SdModel(msgspec.Struct, kw_only=True):
    """One entry of ``GET /sdapi/v1/sd-models`` (clients select a model by ``title``)."""

    title: str
    model_name: str
    hash: str
    sha256: str
    filename: str
    config: str | None = None


class ProgressState(msgspec.Struct, kw_only=True):
    skipped: bool = False
    interrupted: bool = False
    job: str = ""
    job_count: int = 0
    job_timestamp: str = "0"
    job_no: int = 0
    sampling_step: int = 0
    sampling_steps: int = 0


class Progress(msgspec.Struct, kw_only=True):
    """``GET /sdapi/v1/progress``."""

    progress: float
    eta_relative: float
    state: ProgressState
    current_image: str | None = None
    textinfo: str | None = None
