"""AUTOMATIC1111's ``/sdapi/v1`` on Werk's image models, so the tools people drive image
generation from (Open WebUI's image engine, SillyTavern, the ``webuiapi`` client) work by
changing a base URL.

Checked against AUTOMATIC1111/stable-diffusion-webui 1.10 (``modules/api/api.py``,
``models.py``) and ``webuiapi`` 0.9.17. What is served:

* ``POST txt2img`` / ``img2img`` — A1111's bodies (unknown keys ignored, its defaults), run as
  Werk image generations / edits on the **selected checkpoint**, one image at a time so image
  *i* of a request uses seed *seed + i* (``seed: -1`` picks a random one); the answer is
  ``{images, parameters, info}`` with ``info`` a JSON string (``seed``, ``all_seeds``, sizes,
  ``sd_model_name``, ``infotexts``…). Werk's bounds are typed errors in A1111's error shape.
* ``GET sd-models`` — Werk's image models (Diffusers pipelines); ``title`` is ``"<id> [<first
  10 hex of the manifest identity>]"``, ``sha256`` the identity. ``GET/POST options`` —
  ``sd_model_checkpoint`` reads and selects the checkpoint (a title, a model id or a hash; other
  keys are accepted and ignored; ``POST`` answers ``null``). The selection is per API key.
* ``GET progress`` — the caller's running request: images done of the total; the media worker
  reports no per-step progress, so ``sampling_step`` stays 0. ``POST interrupt`` stops it
  (cooperative: the image being made is abandoned, images already made are answered);
  ``POST skip`` moves on to the next image the same way.
* ``GET samplers``, ``schedulers``, ``upscalers``, ``latent-upscale-modes``, ``sd-vae``,
  ``scripts`` — what Werk has: the pipeline's own scheduler (one entry), no upscalers, VAEs or
  scripts; a requested ``sampler_name`` is recorded in ``parameters`` but the pipeline's own
  scheduler runs (``info.sampler_name`` says ``Default``). ``GET memory`` — Werk's telemetry.

Auth is Werk's: ``Authorization: Bearer KEY``, or HTTP Basic with the key as password (what
Open WebUI and SillyTavern send); without keys (loopback) an empty header is fine.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..control.interface import ImageModel, WerkControl
from ..protocol import InvalidRequest, NotFound, Unavailable, encode
from ..protocol.a1111 import ImageResult, Img2Img, Progress, ProgressState, SdModel, Txt2Img
from ..protocol.media import (
    MAX_IMAGE_UPLOAD_BYTES,
    MAX_SEED,
    ImageEditRequest,
    ImageGenerationRequest,
)
from .auth import Authenticator
from .errors import error_response
from .guard import admit_tool_client
from .openai import while_connected
from .requests import decode_body, read_body

__all__ = ["a1111_routes"]

PREFIX = "/sdapi/v1"
MAX_BODY = MAX_IMAGE_UPLOAD_BYTES * 4 // 3 + 1024 * 1024
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff")
SAMPLER = "Default"
"""The one sampler offered: whatever scheduler the pipeline was saved with."""


def _short(identity: str) -> str:
    return identity.removeprefix("sha256:")[:10]


def _title(model: ImageModel) -> str:
    return f"{model.id} [{_short(model.identity)}]"


@dataclass
class _Running:
    """One caller's txt2img/img2img in progress (for ``progress``, ``interrupt``, ``skip``)."""

    total: int
    steps: int
    started: float = field(default_factory=time.time)
    done: int = 0
    image: anyio.CancelScope | None = None
    interrupted: bool = False
    skipped: bool = False


class A1111Api:
    """The routes' shared state: each key's selected checkpoint and running request."""

    def __init__(self, control: WerkControl, auth: Authenticator) -> None:
        self.control = control
        self.auth = auth
        self.selected: dict[str, str] = {}
        self.running: dict[str, _Running] = {}

    # -- checkpoints -----------------------------------------------------------------------------

    async def _models(self) -> list[ImageModel]:
        return await self.control.image_models()

    async def _checkpoint(self, principal: str, name: str | None = None) -> ImageModel:
        models = await self._models()
        if not models:
            raise Unavailable(
                "no image model is served; create one with "
                "`werk models create-demo --kind image --id tiny-image`",
                retryable=False,
            )
        wanted = name if name is not None else self.selected.get(principal)
        if wanted is None:
            return models[0]
        for model in models:
            if wanted in (_title(model), model.id, _short(model.identity), model.identity):
                return model
        if name is None:  # the selected one is gone: back to the first
            return models[0]
        raise NotFound(f"no image model {wanted!r} (GET {PREFIX}/sd-models lists them)")

    async def sd_models(self, principal: str) -> list[SdModel]:
        return [
            SdModel(
                title=_title(m),
                model_name=m.id,
                hash=_short(m.identity),
                sha256=m.identity.removeprefix("sha256:"),
                filename=m.directory,
            )
            for m in await self._models()
        ]

    async def options(self, principal: str) -> dict[str, Any]:
        models = await self._models()
        current = await self._checkpoint(principal) if models else None
        return {
            "sd_model_checkpoint": _title(current) if current else None,
            "sd_checkpoint_hash": current.identity.removeprefix("sha256:") if current else None,
            "samples_format": "png",
            "sd_vae": "Automatic",
            "CLIP_stop_at_last_layers": 1,
        }

    async def set_options(self, principal: str, body: dict[str, Any]) -> None:
        wanted = body.get("sd_model_checkpoint")
        if wanted is None:
            return
        if not isinstance(wanted, str):
            raise InvalidRequest(
                "'sd_model_checkpoint' must be a string", param="sd_model_checkpoint"
            )
        self.selected[principal] = (await self._checkpoint(principal, wanted)).id

    # -- progress --------------------------------------------------------------------------------

    def progress(self, principal: str) -> Progress:
        running = self.running.get(principal)
        if running is None:
            return Progress(progress=0.0, eta_relative=0.0, state=ProgressState())
        fraction = running.done / running.total
        elapsed = time.time() - running.started
        eta = elapsed / fraction - elapsed if fraction > 0 else 0.0
        return Progress(
            progress=fraction,
            eta_relative=max(0.0, eta),
            state=ProgressState(
                interrupted=running.interrupted,
                skipped=running.skipped,
                job=f"Batch {running.done + 1} out of {running.total}",
                job_count=running.total,
                job_timestamp=time.strftime("%Y%m%d%H%M%S", time.localtime(running.started)),
                job_no=running.done,
                sampling_steps=running.steps,
            ),
            textinfo=f"image {running.done + 1} of {running.total}",
        )

    def stop(self, principal: str, *, skip: bool) -> None:
        running = self.running.get(principal)
        if running is None:
            return
        if skip:
            running.skipped = True
        else:
            running.interrupted = True
        if running.image is not None:
            running.image.cancel()

    # -- generation ------------------------------------------------------------------------------

    async def generate(self, principal: str, asked: Txt2Img, image: bytes | None) -> ImageResult:
        asked.check()
        settings = asked.override_settings or {}
        checkpoint = settings.get("sd_model_checkpoint")
        model = await self._checkpoint(
            principal, checkpoint if isinstance(checkpoint, str) else None
        )
        seed = asked.seed if asked.seed != -1 else secrets.randbelow(MAX_SEED + 1)
        count = asked.count()
        running = _Running(total=count, steps=asked.steps)
        self.running[principal] = running
        images: list[str] = []
        seeds: list[int] = []
        try:
            for index in range(count):
                if running.interrupted:
                    break
                this_seed = (seed + index) % (MAX_SEED + 1)
                route, body = self._backend_body(model, asked, this_seed, image)
                with anyio.CancelScope() as scope:
                    running.image = scope
                    reply = await self.control.openai_request(principal, route, body)
                    images.append(str((reply.body or {})["data"][0]["b64_json"]))
                    seeds.append(this_seed)
                running.image = None
                running.skipped = False
                running.done += 1
        finally:
            if self.running.get(principal) is running:
                del self.running[principal]
        parameters = msgspec.to_builtins(asked)
        if isinstance(asked, Img2Img):
            parameters["init_images"] = None  # A1111 does not echo the input images either
        return ImageResult(
            images=images if asked.send_images else [],
            parameters=parameters,
            info=json.dumps(self._info(model, asked, seed, seeds, running.interrupted)),
        )

    @staticmethod
    def _backend_body(
        model: ImageModel, asked: Txt2Img, seed: int, image: bytes | None
    ) -> tuple[Any, dict[str, Any]]:
        """The Werk image request for one image, built and bounded by Werk's own Structs."""
        common: dict[str, Any] = {
            "model": model.id,
            "prompt": asked.prompt or " ",
            "negative_prompt": asked.negative_prompt or None,
            "size": f"{asked.width}x{asked.height}",
            "seed": seed,
            "steps": asked.steps,
            "guidance_scale": asked.cfg_scale,
            "response_format": "b64_json",
        }
        if image is None:
            parsed = decode_body(msgspec.json.encode(common), ImageGenerationRequest)
            parsed.validate()
            body: dict[str, Any] = msgspec.to_builtins(parsed)
            body.pop("async", None)
            return "images.generations", body
        assert isinstance(asked, Img2Img)
        common["strength"] = asked.denoising_strength
        edit = decode_body(msgspec.json.encode(common), ImageEditRequest)
        edit.validate()
        body = msgspec.to_builtins(edit)
        body["image_b64"] = base64.b64encode(image).decode("ascii")
        return "images.edits", body

    @staticmethod
    def _info(
        model: ImageModel, asked: Txt2Img, seed: int, seeds: list[int], interrupted: bool
    ) -> dict[str, Any]:
        text = (
            f"{asked.prompt}\nNegative prompt: {asked.negative_prompt}\n"
            f"Steps: {asked.steps}, Sampler: {SAMPLER}, CFG scale: {asked.cfg_scale}, "
            f"Seed: {seed}, Size: {asked.width}x{asked.height}, "
            f"Model hash: {_short(model.identity)}, Model: {model.id}"
        )
        return {
            "prompt": asked.prompt,
            "all_prompts": [asked.prompt] * len(seeds),
            "negative_prompt": asked.negative_prompt,
            "all_negative_prompts": [asked.negative_prompt] * len(seeds),
            "seed": seed,
            "all_seeds": seeds,
            "subseed": -1,
            "all_subseeds": [-1] * len(seeds),
            "width": asked.width,
            "height": asked.height,
            "sampler_name": SAMPLER,
            "cfg_scale": asked.cfg_scale,
            "steps": asked.steps,
            "batch_size": asked.batch_size,
            "sd_model_name": model.id,
            "sd_model_hash": _short(model.identity),
            "denoising_strength": getattr(asked, "denoising_strength", None),
            "infotexts": [text.replace(f"Seed: {seed}", f"Seed: {s}") for s in seeds],
            "interrupted": interrupted,
        }


def _init_image(encoded: str) -> bytes:
    """An ``init_images`` entry: base64, raw or as a ``data:image/…;base64,`` URL."""
    payload = encoded.split(";base64,", 1)[1] if encoded.startswith("data:") else encoded
    if len(payload) > MAX_IMAGE_UPLOAD_BYTES * 4 // 3 + 4:
        raise InvalidRequest(f"the init image is over {MAX_IMAGE_UPLOAD_BYTES} bytes")
    try:
        image = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("'init_images' must hold base64 images", param="init_images") from None
    if not image.startswith(_IMAGE_MAGIC):
        raise InvalidRequest("the init image must be a PNG or JPEG", param="init_images")
    return image


def _json(value: Any) -> Response:
    return Response(encode(value), 200, media_type="application/json")


def a1111_routes(control: WerkControl, auth: Authenticator) -> list[Route]:
    """The ``/sdapi/v1`` routes."""
    api = A1111Api(control, auth)
    Handler = Callable[[Request, str], Awaitable[Any]]

    def route(path: str, handler: Handler, method: str) -> Route:
        async def run(request: Request) -> Response:
            try:
                principal = admit_tool_client(request, auth)
                return _json(await handler(request, principal))
            except Exception as exc:
                return error_response(request, exc)

        return Route(PREFIX + path, run, methods=[method])

    async def txt2img(request: Request, principal: str) -> ImageResult:
        asked = decode_body(await read_body(request, MAX_BODY), Txt2Img)
        return await while_connected(request, api.generate(principal, asked, None))

    async def img2img(request: Request, principal: str) -> ImageResult:
        asked = decode_body(await read_body(request, MAX_BODY), Img2Img)
        asked.check()
        image = _init_image(asked.init_images[0])
        return await while_connected(request, api.generate(principal, asked, image))

    async def set_options(request: Request, principal: str) -> None:
        body = decode_body(await read_body(request, 1024 * 1024), dict[str, Any])
        await api.set_options(principal, body)

    async def interrupt(request: Request, principal: str) -> dict[str, Any]:
        api.stop(principal, skip=False)
        return {}

    async def skip(request: Request, principal: str) -> None:
        api.stop(principal, skip=True)

    async def memory(request: Request, principal: str) -> dict[str, Any]:
        snapshot = await control.memory()
        host = snapshot.host
        ram = (
            {"free": host.available_bytes, "used": host.used_bytes, "total": host.total_bytes}
            if host is not None
            else {"error": "host memory is not observable"}
        )
        return {"ram": ram, "cuda": {"error": "Werk reports accelerators at /werk/v1/memory"}}

    def constant(value: Any) -> Handler:
        async def answer(request: Request, principal: str) -> Any:
            return value

        return answer

    sampler = [{"name": SAMPLER, "aliases": ["default"], "options": {}}]
    scheduler = [
        {
            "name": "automatic",
            "label": "Automatic",
            "aliases": None,
            "default_rho": -1,
            "need_inner_model": False,
        }
    ]
    return [
        route("/txt2img", txt2img, "POST"),
        route("/img2img", img2img, "POST"),
        route("/sd-models", lambda request, principal: api.sd_models(principal), "GET"),
        route("/options", lambda request, principal: api.options(principal), "GET"),
        route("/options", set_options, "POST"),
        route("/progress", _sync(lambda principal: api.progress(principal)), "GET"),
        route("/interrupt", interrupt, "POST"),
        route("/skip", skip, "POST"),
        route("/samplers", constant(sampler), "GET"),
        route("/schedulers", constant(scheduler), "GET"),
        route("/upscalers", constant([]), "GET"),
        route("/latent-upscale-modes", constant([]), "GET"),
        route("/sd-vae", constant([]), "GET"),
        route("/scripts", constant({"txt2img": [], "img2img": []}), "GET"),
        route("/memory", memory, "GET"),
    ]


def _sync(work: Callable[[str], Any]) -> Callable[[Request, str], Awaitable[Any]]:
    async def answer(request: Request, principal: str) -> Any:
        return work(principal)

    return answer
