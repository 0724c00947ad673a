"""ComfyUI graphs Werk runs (``werk.http.comfy_graph``): the standard text-to-image graph and
its image-to-image variant become save plans; anything else is refused in ComfyUI's shape."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from werk.http.comfy_graph import (
    NODE_CLASSES,
    GraphRefused,
    SpeechPlan,
    object_info,
    plan_graph,
)

GRAPH: dict[str, Any] = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "m"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a cat", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "dog", "clip": ["4", 1]}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 32, "batch_size": 3}},
    "3": {"class_type": "KSampler", "inputs": {
        "model": ["4", 0], "seed": 9, "steps": 5, "cfg": 6, "sampler_name": "default",
        "scheduler": "default", "positive": ["6", 0], "negative": ["7", 0],
        "latent_image": ["5", 0], "denoise": 1.0}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "x"}},
}  # fmt: skip


def test_the_text_to_image_graph_becomes_one_save() -> None:
    (plan,) = plan_graph(GRAPH, ["m"], [])
    assert (plan.node, plan.model, plan.prompt, plan.negative) == ("9", "m", "a cat", "dog")
    assert (plan.width, plan.height, plan.count, plan.seed, plan.steps) == (64, 32, 3, 9, 5)
    assert plan.cfg == 6.0 and plan.upload is None
    assert plan.order[0] == "4" and plan.order[-1] == "9"


def test_the_image_to_image_variant_uses_the_upload_and_denoise() -> None:
    graph = copy.deepcopy(GRAPH)
    del graph["5"]
    graph["10"] = {"class_type": "LoadImage", "inputs": {"image": "in.png"}}
    graph["11"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["10", 0], "vae": ["4", 2]}}
    graph["3"]["inputs"].update(latent_image=["11", 0], denoise=0.4)
    (plan,) = plan_graph(graph, ["m"], ["in.png"])
    assert plan.upload == "in.png" and plan.strength == 0.4 and plan.count == 1
    with pytest.raises(GraphRefused) as refused:
        plan_graph(graph, ["m"], [])
    assert "was not uploaded" in str(refused.value.node_errors["10"])


@pytest.mark.parametrize(
    ("change", "node", "kind"),
    [
        (lambda g: g["4"]["inputs"].update(ckpt_name="other"), "4", "failed_validation"),
        (lambda g: g["5"]["inputs"].update(width=2048), "5", "failed_validation"),
        (lambda g: g["5"]["inputs"].update(width=60), "5", "failed_validation"),
        (lambda g: g["3"]["inputs"].update(steps=0), "3", "failed_validation"),
        (lambda g: g["3"]["inputs"].update(positive=["5", 0]), "3", "failed_validation"),
        (lambda g: g.update({"12": {"class_type": "LoraLoader", "inputs": {}}}), "12", "invalid"),
    ],
)
def test_what_werk_does_not_run_is_refused_naming_the_node(
    change: Any, node: str, kind: str
) -> None:
    graph = copy.deepcopy(GRAPH)
    change(graph)
    with pytest.raises(GraphRefused) as refused:
        plan_graph(graph, ["m"], [])
    assert kind in refused.value.error["type"]
    assert node in refused.value.node_errors


def test_a_graph_without_output_and_object_info() -> None:
    with pytest.raises(GraphRefused) as refused:
        plan_graph({k: v for k, v in GRAPH.items() if k != "9"}, ["m"], [])
    assert refused.value.error["type"] == "prompt_no_outputs"
    info = object_info(["a", "b"], ["x.png"])
    assert set(info) == {*NODE_CLASSES, "UNETLoader", "VAELoader"}
    assert info["UNETLoader"]["input"]["required"]["unet_name"] == [[]]
    assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"] == [["a", "b"]]
    assert info["SaveImage"]["output_node"] is True


def test_the_speech_graph_becomes_a_speech_plan() -> None:
    graph = {
        "1": {"class_type": "WerkTextToSpeech",
              "inputs": {"model": "tts", "text": "hi", "voice": "", "seed": 4}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "a"}},
    }  # fmt: skip
    (plan,) = plan_graph(graph, [], [], ["tts"])
    assert isinstance(plan, SpeechPlan)
    assert (plan.model, plan.text, plan.voice, plan.seed) == ("tts", "hi", None, 4)
    with pytest.raises(GraphRefused) as refused:
        plan_graph(graph, [], [], ["other"])
    assert "1" in refused.value.node_errors
