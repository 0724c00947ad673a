"""ComfyUI prompt graphs Werk can execute: the node classes it offers and how a graph becomes
Werk image requests.

Checked against Comfy-Org/ComfyUI 0.3.64 (``nodes.py`` for the classes and their inputs,
``execution.py`` for validation and its error shapes). A graph is ``{node_id: {"class_type",
"inputs"}}``; an input is a value or a link ``[node_id, output_index]``. Werk executes the
standard text-to-image graph and its image-to-image variant:

* ``CheckpointLoaderSimple`` (``ckpt_name``: a Werk image model id) → MODEL, CLIP, VAE;
* ``CLIPTextEncode`` (``text``, ``clip``) → CONDITIONING;
* ``EmptyLatentImage`` (``width``, ``height``, ``batch_size``) → LATENT — text to image;
* ``LoadImage`` (``image``: an uploaded name) → IMAGE, MASK, and ``VAEEncode`` (``pixels``,
  ``vae``) → LATENT — image to image, ``KSampler.denoise`` being the strength;
* ``KSampler`` (``model``, ``seed``, ``steps``, ``cfg``, ``sampler_name``, ``scheduler``,
  ``positive``, ``negative``, ``latent_image``, ``denoise``) → LATENT;
* ``VAEDecode`` (``samples``, ``vae``) → IMAGE, and ``SaveImage`` (``images``,
  ``filename_prefix``), the output node;
* ``WerkTextToSpeech`` (``model``: a Werk speech model, ``text``, ``voice``, ``seed``) → AUDIO,
  and ``SaveAudio`` (``audio``, ``filename_prefix``), the speech graph's output node: a Werk
  ``/v1/audio/speech`` request run as a durable job (the seed's "asynchronously, as the ComfyUI
  node does").

Each ``SaveImage`` becomes a :class:`SavePlan`: image *i* of a batch uses seed *seed + i*.
Anything else — an unknown class, a wrong link, a value out of Werk's bounds — is a
:class:`GraphRefused` carrying ComfyUI's ``error`` and ``node_errors`` bodies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..protocol.media import IMAGE_SIDE_MAX, IMAGE_SIDE_MIN, MAX_IMAGES, MAX_SEED, MAX_STEPS

__all__ = [
    "NODE_CLASSES",
    "GraphRefused",
    "SavePlan",
    "SpeechPlan",
    "object_info",
    "plan_graph",
]

SAMPLERS = ["default"]
SCHEDULERS = ["default"]


def _int(default: int, low: int, high: int, step: int = 1) -> list[Any]:
    return ["INT", {"default": default, "min": low, "max": high, "step": step}]


def _node(
    required: dict[str, Any],
    output: Sequence[str],
    *,
    names: Sequence[str] | None = None,
    output_node: bool = False,
    display: str = "",
    category: str = "werk",
) -> dict[str, Any]:
    return {
        "input": {"required": required},
        "input_order": {"required": list(required)},
        "output": list(output),
        "output_is_list": [False] * len(output),
        "output_name": list(names or output),
        "display_name": display,
        "description": "",
        "python_module": "werk",
        "category": category,
        "output_node": output_node,
    }


def object_info(
    models: Sequence[str], uploads: Sequence[str], speakers: Sequence[str] = ()
) -> dict[str, Any]:
    """``GET /object_info``: Werk's node classes, the model ids and uploaded images as choices
    (``speakers``: the speech models)."""
    side = _int(512, IMAGE_SIDE_MIN, IMAGE_SIDE_MAX, 8)
    classes = {
        "CheckpointLoaderSimple": _node(
            {"ckpt_name": [list(models)]}, ["MODEL", "CLIP", "VAE"], display="Load Checkpoint"
        ),
        "CLIPTextEncode": _node(
            {"text": ["STRING", {"multiline": True}], "clip": ["CLIP"]},
            ["CONDITIONING"],
            display="CLIP Text Encode (Prompt)",
        ),
        "EmptyLatentImage": _node(
            {"width": side, "height": side, "batch_size": _int(1, 1, MAX_IMAGES)},
            ["LATENT"],
            display="Empty Latent Image",
        ),
        "LoadImage": _node(
            {"image": [sorted(uploads), {"image_upload": True}]},
            ["IMAGE", "MASK"],
            display="Load Image",
        ),
        "VAEEncode": _node({"pixels": ["IMAGE"], "vae": ["VAE"]}, ["LATENT"], display="VAE Encode"),
        "KSampler": _node(
            {
                "model": ["MODEL"],
                "seed": _int(0, 0, MAX_SEED),
                "steps": _int(20, 1, MAX_STEPS),
                "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 30.0, "step": 0.1}],
                "sampler_name": [SAMPLERS],
                "scheduler": [SCHEDULERS],
                "positive": ["CONDITIONING"],
                "negative": ["CONDITIONING"],
                "latent_image": ["LATENT"],
                "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}],
            },
            ["LATENT"],
            display="KSampler",
        ),
        "VAEDecode": _node(
            {"samples": ["LATENT"], "vae": ["VAE"]}, ["IMAGE"], display="VAE Decode"
        ),
        "SaveImage": _node(
            {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]},
            [],
            output_node=True,
            display="Save Image",
        ),
        "WerkTextToSpeech": _node(
            {
                "model": [list(speakers)],
                "text": ["STRING", {"multiline": True}],
                "voice": ["STRING", {"default": ""}],
                "seed": _int(0, 0, MAX_SEED),
            },
            ["AUDIO"],
            display="Werk Text to Speech",
        ),
        "SaveAudio": _node(
            {"audio": ["AUDIO"], "filename_prefix": ["STRING", {"default": "audio/ComfyUI"}]},
            [],
            output_node=True,
            display="Save Audio",
        ),
    }
    # Listed, with no choices, because clients read them unconditionally (SillyTavern's model
    # list maps UNETLoader's and VAELoader's choices); Werk runs neither.
    for name, key, output in (
        ("UNETLoader", "unet_name", "MODEL"),
        ("VAELoader", "vae_name", "VAE"),
    ):
        classes[name] = _node({key: [[]]}, [output], display=f"{name} (none in Werk)")
    for name, info in classes.items():
        info["name"] = name
    return classes


LISTED_ONLY = ("UNETLoader", "VAELoader")
NODE_CLASSES = tuple(name for name in object_info([], []) if name not in LISTED_ONLY)
"""The classes Werk executes (``/object_info`` also lists :data:`LISTED_ONLY`)."""


@dataclass
class SavePlan:
    """What one ``SaveImage`` node asks for."""

    node: str
    sampler: str
    order: list[str]
    """The nodes it depends on, in execution order (for ``executing`` events)."""
    model: str
    prompt: str
    negative: str
    width: int
    height: int
    count: int
    seed: int
    steps: int
    cfg: float
    upload: str | None = None
    strength: float = 1.0
    prefix: str = "ComfyUI"


@dataclass
class SpeechPlan:
    """What one ``SaveAudio`` node asks for: a Werk speech request, run as a job."""

    node: str
    speaker: str
    model: str
    text: str
    voice: str | None
    seed: int
    order: list[str] = field(default_factory=list)


@dataclass
class GraphRefused(Exception):
    """A graph Werk will not run: ComfyUI's 400 body (``error`` and ``node_errors``)."""

    error: dict[str, Any]
    node_errors: dict[str, Any] = field(default_factory=dict)


def _error(kind: str, message: str, details: str = "") -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": {}}


class _Graph:
    def __init__(
        self, prompt: Mapping[str, Any], models: Sequence[str], uploads: Sequence[str]
    ) -> None:
        self.prompt = prompt
        self.models = models
        self.uploads = uploads
        self.errors: dict[str, list[dict[str, Any]]] = {}

    def fail(self, node: str, message: str, details: str = "") -> None:
        self.errors.setdefault(node, []).append(_error("value_not_valid", message, details))

    def node(self, node_id: str) -> Mapping[str, Any]:
        return self.prompt[node_id]  # type: ignore[no-any-return]

    def linked(self, node: str, name: str, wanted: str) -> str | None:
        """The node a link input points at, when it is a node of class ``wanted``."""
        value = self.node(node).get("inputs", {}).get(name)
        if not (isinstance(value, list) and len(value) == 2 and str(value[0]) in self.prompt):
            self.fail(node, f"input '{name}' must be linked to a {wanted} node", name)
            return None
        target = str(value[0])
        if self.node(target).get("class_type") != wanted:
            self.fail(node, f"input '{name}' must come from {wanted}", name)
            return None
        return target

    def value(self, node: str, name: str, kind: type, low: float, high: float) -> Any:
        """A number input in ``low..high`` (``low`` and a recorded error otherwise)."""
        value = self.node(node).get("inputs", {}).get(name)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not isinstance(value, kind)
            or not low <= value <= high
        ):
            self.fail(node, f"'{name}' must be a {kind.__name__} in {low:g}..{high:g}", name)
            return low
        return value

    def text(self, node: str, name: str) -> str:
        value = self.node(node).get("inputs", {}).get(name)
        if not isinstance(value, str):
            self.fail(node, f"'{name}' must be a string", name)
            return ""
        return value


def _check_classes(prompt: Mapping[str, Any]) -> None:
    if not isinstance(prompt, Mapping) or not prompt:
        raise GraphRefused(_error("invalid_prompt", "the prompt must be a non-empty graph"))
    errors: dict[str, Any] = {}
    for node_id, node in prompt.items():
        kind = node.get("class_type") if isinstance(node, Mapping) else None
        if kind not in NODE_CLASSES:
            errors[str(node_id)] = {
                "errors": [
                    _error(
                        "invalid_prompt",
                        f"Werk does not execute node class {kind!r}",
                        f"Werk runs: {', '.join(NODE_CLASSES)}",
                    )
                ],
                "dependent_outputs": [],
                "class_type": kind,
            }
    if errors:
        raise GraphRefused(
            _error("invalid_prompt", "Cannot execute because a node is not offered by Werk."),
            errors,
        )


def plan_graph(
    prompt: Mapping[str, Any],
    models: Sequence[str],
    uploads: Sequence[str],
    speakers: Sequence[str] = (),
) -> list[SavePlan | SpeechPlan]:
    """The saves ``prompt`` asks for.

    :raises GraphRefused: the graph is not one Werk runs (ComfyUI's 400 body).
    """
    _check_classes(prompt)
    graph = _Graph(prompt, models, uploads)
    outputs = [
        str(n) for n, node in prompt.items() if node["class_type"] in ("SaveImage", "SaveAudio")
    ]
    if not outputs:
        raise GraphRefused(_error("prompt_no_outputs", "Prompt has no outputs"))
    plans: list[SavePlan | SpeechPlan] = []
    for save in outputs:
        made = (
            _plan(graph, save)
            if prompt[save]["class_type"] == "SaveImage"
            else _speech(graph, save, speakers)
        )
        if made is not None:
            plans.append(made)
    if graph.errors:
        raise GraphRefused(
            _error("prompt_outputs_failed_validation", "Prompt outputs failed validation"),
            {
                node: {
                    "errors": errors,
                    "dependent_outputs": outputs,
                    "class_type": prompt[node]["class_type"],
                }
                for node, errors in graph.errors.items()
            },
        )
    return plans


def _plan(graph: _Graph, save: str) -> SavePlan | None:
    decode = graph.linked(save, "images", "VAEDecode")
    sampler = graph.linked(decode, "samples", "KSampler") if decode else None
    if decode is None or sampler is None:
        return None
    loader = graph.linked(sampler, "model", "CheckpointLoaderSimple")
    positive = graph.linked(sampler, "positive", "CLIPTextEncode")
    negative = graph.linked(sampler, "negative", "CLIPTextEncode")
    latent_node = graph.node(sampler).get("inputs", {}).get("latent_image")
    latent = str(latent_node[0]) if isinstance(latent_node, list) and latent_node else ""
    kind = graph.prompt.get(latent, {}).get("class_type")
    if loader is None or positive is None or negative is None:
        return None
    model = graph.text(loader, "ckpt_name")
    if model not in graph.models:
        graph.fail(loader, f"'ckpt_name' {model!r} is not one of Werk's image models", "ckpt_name")
    plan = SavePlan(
        node=save,
        sampler=sampler,
        order=[loader, positive, negative, latent, sampler, decode, save],
        model=model,
        prompt=graph.text(positive, "text"),
        negative=graph.text(negative, "text"),
        width=512,
        height=512,
        count=1,
        seed=graph.value(sampler, "seed", int, 0, MAX_SEED),
        steps=graph.value(sampler, "steps", int, 1, MAX_STEPS),
        cfg=graph.value(sampler, "cfg", float, 0.0, 30.0),
        prefix=str(graph.node(save).get("inputs", {}).get("filename_prefix") or "ComfyUI"),
    )
    denoise = graph.value(sampler, "denoise", float, 0.0, 1.0)
    if kind == "EmptyLatentImage":
        plan.width = graph.value(latent, "width", int, IMAGE_SIDE_MIN, IMAGE_SIDE_MAX)
        plan.height = graph.value(latent, "height", int, IMAGE_SIDE_MIN, IMAGE_SIDE_MAX)
        plan.count = graph.value(latent, "batch_size", int, 1, MAX_IMAGES)
        for side in ("width", "height"):
            if getattr(plan, side) % 8:
                graph.fail(latent, f"'{side}' must be a multiple of 8", side)
    elif kind == "VAEEncode":
        load = graph.linked(latent, "pixels", "LoadImage")
        if load is not None:
            plan.upload = graph.text(load, "image")
            if plan.upload not in graph.uploads:
                graph.fail(load, f"image {plan.upload!r} was not uploaded (POST /upload/image)")
            plan.order.insert(3, load)
        if not 0.0 < denoise <= 1.0:
            graph.fail(sampler, "'denoise' must be above 0 to change an image", "denoise")
        plan.strength = denoise
    else:
        graph.fail(sampler, "'latent_image' must come from EmptyLatentImage or VAEEncode")
    return plan


def _speech(graph: _Graph, save: str, speakers: Sequence[str]) -> SpeechPlan | None:
    speaker = graph.linked(save, "audio", "WerkTextToSpeech")
    if speaker is None:
        return None
    model = graph.text(speaker, "model")
    if model not in speakers:
        graph.fail(speaker, f"'model' {model!r} is not one of Werk's speech models", "model")
    text = graph.text(speaker, "text")
    if not text.strip():
        graph.fail(speaker, "'text' must not be empty", "text")
    voice = graph.node(speaker).get("inputs", {}).get("voice") or None
    if voice is not None and not isinstance(voice, str):
        graph.fail(speaker, "'voice' must be a string", "voice")
    return SpeechPlan(
        node=save,
        speaker=speaker,
        model=model,
        text=text,
        voice=voice if isinstance(voice, str) else None,
        seed=graph.value(speaker, "seed", int, 0, MAX_SEED),
        order=[speaker, save],
    )
