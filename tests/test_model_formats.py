"""The host's check of Diffusers and Transformers directories and the facts it reads from them
(before a manifest is written), and the ``inspect`` field of a backend descriptor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _model_dirs import write_safetensors

from werk import BackendDescriptor, InvalidRequest, ModelFacts, ModelSpec
from werk.model_formats import directory_facts, formats_of, inspect_model, model_root
from werk.models import ModelRegistry


def transformers_dir(root: Path, config: dict[str, object] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(
        json.dumps(
            config
            or {
                "architectures": ["MixtralForCausalLM"],
                "max_position_embeddings": 32768,
                "num_local_experts": 8,
                "num_experts_per_tok": 2,
            }
        )
    )
    (root / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    write_safetensors(
        root / "model.safetensors", {"embed": ("BF16", (100, 16)), "norm": ("F32", (16,))}
    )
    return root


def diffusers_dir(root: Path) -> Path:
    (root / "unet").mkdir(parents=True)
    (root / "model_index.json").write_text(
        json.dumps(
            {
                "_class_name": "StableDiffusionPipeline",
                "unet": ["diffusers", "UNet2DConditionModel"],
                "safety_checker": [None, None],
            }
        )
    )
    write_safetensors(root / "unet" / "diffusion_pytorch_model.safetensors", {"w": ("F16", (8, 8))})
    return root


def test_transformers_facts_come_from_config_tokenizer_and_safetensors(tmp_path: Path) -> None:
    facts = directory_facts(transformers_dir(tmp_path / "llm"))
    assert facts == ModelFacts(
        format="transformers",
        architecture="MixtralForCausalLM",
        parameters=100 * 16 + 16,
        quantization="BF16",
        context_length=32768,
        chat_template=True,
        experts=8,
        experts_used=2,
    )


def test_a_quantised_config_names_its_method_and_text_config_is_read(tmp_path: Path) -> None:
    root = transformers_dir(
        tmp_path / "vl",
        {
            "model_type": "qwen2_vl",
            "text_config": {"max_position_embeddings": 4096},
            "quantization_config": {"quant_method": "awq"},
        },
    )
    facts = directory_facts(root)
    assert (facts.architecture, facts.context_length, facts.quantization, facts.experts) == (
        "qwen2_vl",
        4096,
        "awq",
        None,
    )


def test_diffusers_facts_and_components(tmp_path: Path) -> None:
    facts = directory_facts(diffusers_dir(tmp_path / "sd"))
    assert (facts.format, facts.architecture, facts.parameters, facts.quantization) == (
        "diffusers",
        "StableDiffusionPipeline",
        64,
        "F16",
    )


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        (lambda r: (r / "config.json").write_text("{not json"), "config.json is not valid JSON"),
        (lambda r: (r / "config.json").write_text("[1]"), "config.json is not a JSON object"),
        (lambda r: (r / "model.safetensors").unlink(), "has config.json but no weights"),
        (
            lambda r: (r / "model.safetensors").write_bytes(b"\0" * 64),
            "model.safetensors is not a readable safetensors file",
        ),
        (
            lambda r: (r / "model.safetensors").write_bytes(
                (r / "model.safetensors").read_bytes()[:-10]
            ),
            "model.safetensors is not a readable safetensors file",
        ),
        (
            lambda r: (r / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"a": "model-00002-of-00002.safetensors"}})
            ),
            "names model-00002-of-00002.safetensors, which is missing",
        ),
    ],
    ids=["bad-json", "not-object", "no-weights", "junk-weights", "cut-weights", "missing-shard"],
)
def test_a_broken_transformers_directory_is_refused_with_the_reason(
    tmp_path: Path, breakage: object, reason: str
) -> None:
    root = transformers_dir(tmp_path / "llm")
    breakage(root)  # type: ignore[operator]
    with pytest.raises(InvalidRequest, match=reason):
        directory_facts(root)


def test_a_pipeline_missing_a_component_is_refused(tmp_path: Path) -> None:
    root = diffusers_dir(tmp_path / "sd")
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(
        json.dumps({**index, "vae": ["diffusers", "AutoencoderKL"]})
    )
    with pytest.raises(InvalidRequest, match="names component 'vae', which is missing"):
        directory_facts(root)
    (root / "model_index.json").write_text(json.dumps({"unet": ["diffusers", "UNet"]}))
    with pytest.raises(InvalidRequest, match="names no pipeline class"):
        directory_facts(root)


def test_formats_and_roots(tmp_path: Path) -> None:
    llm, sd = transformers_dir(tmp_path / "llm"), diffusers_dir(tmp_path / "sd")
    assert formats_of([llm, sd, tmp_path / "x.GGUF"]) == {"hf", "diffusers", "gguf"}
    with pytest.raises(InvalidRequest, match="not a model"):
        formats_of([tmp_path])
    files = tuple(sorted(p for p in sd.rglob("*") if p.is_file()))
    assert model_root(files) == sd
    assert model_root((tmp_path / "x.gguf",)) is None


def spec_of(files: tuple[Path, ...]) -> ModelSpec:
    return ModelSpec(id="m", backend="b", identity="sha256:x", files=files)


def test_the_backends_facts_win_and_its_refusal_leaves_the_registry_untouched(
    tmp_path: Path,
) -> None:
    llm = transformers_dir(tmp_path / "llm")
    files = tuple(sorted(p for p in llm.rglob("*") if p.is_file()))
    plain = BackendDescriptor(name="plain")
    assert inspect_model(spec_of(files), plain) == directory_facts(llm)
    own = ModelFacts(format="transformers", architecture="mine")
    reading = BackendDescriptor(name="reading", inspect=lambda spec: own)
    assert inspect_model(spec_of(files), reading) == own

    def refuse(spec: ModelSpec) -> ModelFacts:
        raise InvalidRequest(f"{spec.files[0].name} is not for this backend")

    registry = ModelRegistry(tmp_path / "home")
    with pytest.raises(InvalidRequest, match="is not for this backend"):
        registry.import_files(list(files), model_id="m", backend="b", inspect=refuse)
    assert registry.manifests() == []
    registry.import_files(list(files), model_id="m", backend="b", inspect=lambda s: None)
    assert [m.id for m in registry.manifests()] == ["m"]


def test_an_inspect_returning_something_else_is_a_plugin_defect() -> None:
    odd = BackendDescriptor(name="odd", inspect=lambda spec: {"format": "gguf"})  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="inspect returned dict"):
        odd.inspect_model(spec_of(()))
    deferred = BackendDescriptor(name="later", inspect="werk.model_formats:formats_of")
    assert deferred.inspect is not None and not isinstance(deferred.inspect, str)
    with pytest.raises(ValueError, match=r"package\.module:function"):
        BackendDescriptor(name="bad", inspect="not a reference")
