"""Model formats the host recognises by their files, and what it reads from a model directory.

A single file's format is its suffix (``gguf``); its contents are the backend's to check
(:attr:`werk.BackendDescriptor.inspect`). A directory is a Diffusers pipeline when it holds
``model_index.json``, an ONNX Runtime GenAI model when it holds ``genai_config.json`` (its
builder's output) and a Hugging Face (Transformers) model when it holds ``config.json``; the
host checks such a directory itself, the same way for every backend that serves it, before a
manifest is written: the JSON parses to an object, a pipeline's components have their
folders, a Transformers model has weights (every shard a ``*.index.json`` names), and
``.safetensors`` headers parse. It reads the facts those files state (architecture, context
length, experts, chat template, parameter count and storage type from the safetensors
headers) without importing any ML library.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Any

from .backends import BackendDescriptor, ModelFacts, ModelSpec
from .protocol import InvalidRequest

__all__ = [
    "DIFFUSERS",
    "ONNX_GENAI",
    "TRANSFORMERS",
    "directory_facts",
    "formats_of",
    "inspect_model",
    "model_root",
]

DIFFUSERS = "diffusers"
ONNX_GENAI = "onnx-genai"
TRANSFORMERS = "hf"
MARKERS = ("model_index.json", "genai_config.json", "config.json")
"""The file that makes a directory a model, in the order they are looked for."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".onnx", ".npz", ".msgpack")
_MAX_JSON_BYTES = 16 * 1024 * 1024
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def formats_of(paths: list[Path]) -> set[str]:
    """The formats the paths name: a file's suffix (``gguf``); a Diffusers pipeline directory
    (``model_index.json``) is ``diffusers``; an ONNX Runtime GenAI directory
    (``genai_config.json``) is ``onnx-genai``; another directory with a ``config.json`` is a
    Hugging Face model (``hf``: more than one backend may serve it).

    :raises werk.InvalidRequest: a directory that is neither.
    """
    formats: set[str] = set()
    for path in paths:
        if not path.is_dir():
            formats.add(path.suffix.lower().lstrip("."))
        elif (path / "model_index.json").is_file():
            formats.add(DIFFUSERS)
        elif (path / "genai_config.json").is_file():
            formats.add(ONNX_GENAI)
        elif (path / "config.json").is_file():
            formats.add(TRANSFORMERS)
        else:
            raise InvalidRequest(f"{path} is a directory without {', '.join(MARKERS)}: not a model")
    return formats


def _json_object(path: Path) -> dict[str, Any]:
    try:
        if path.stat().st_size > _MAX_JSON_BYTES:
            raise InvalidRequest(f"{path.name} is larger than 16 MiB: not a model config")
        loaded = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise InvalidRequest(f"{path.name} is missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidRequest(f"{path.name} is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(loaded, dict):
        raise InvalidRequest(f"{path.name} is not a JSON object")
    return loaded


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor directory of one ``.safetensors`` file (8-byte length, then JSON).

    :raises werk.InvalidRequest: a file that is not safetensors."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(8)
            (length,) = struct.unpack("<Q", raw) if len(raw) == 8 else (0,)
            if not 2 <= length <= _MAX_SAFETENSORS_HEADER:
                raise ValueError("bad header length")
            header = json.loads(handle.read(length))
        if not isinstance(header, dict):
            raise ValueError("header is not an object")
        size = path.stat().st_size
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            start, end = tensor["data_offsets"]
            if not 0 <= start <= end <= size - 8 - length:
                raise ValueError(f"tensor {name} lies outside the file")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as exc:
        raise InvalidRequest(
            f"{path.name} is not a readable safetensors file ({type(exc).__name__})"
        ) from None
    return header


def _weights(root: Path) -> list[Path]:
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and p.suffix.lower() in WEIGHT_SUFFIXES and not p.name.startswith(".")
    )


def _check_shard_indexes(root: Path) -> None:
    for index in root.rglob("*.index.json"):
        mapping = _json_object(index).get("weight_map")
        if not isinstance(mapping, dict):
            raise InvalidRequest(f"{index.name} has no weight_map")
        for shard in sorted({str(v) for v in mapping.values()}):
            if not (index.parent / shard).is_file():
                raise InvalidRequest(f"{index.name} names {shard}, which is missing")


def _tensor_summary(weights: list[Path]) -> tuple[int | None, str | None]:
    """Parameter count and dominant storage type over the safetensors files (``None`` when
    the weights are in another format)."""
    tensors = [w for w in weights if w.suffix.lower() == ".safetensors"]
    if not tensors:
        return None, None
    count = 0
    by_type: Counter[str] = Counter()
    for path in tensors:
        for name, tensor in _safetensors_header(path).items():
            if name == "__metadata__":
                continue
            elements = 1
            for dim in tensor.get("shape", ()):
                elements *= int(dim)
            count += elements
            by_type[str(tensor.get("dtype", "?"))] += elements
    dominant = by_type.most_common(1)[0][0] if by_type else None
    return count, dominant


def _positive(config: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _transformers_facts(root: Path) -> ModelFacts:
    config = _json_object(root / "config.json")
    weights = _weights(root)
    if not weights:
        raise InvalidRequest(
            f"{root.name} has config.json but no weights ({', '.join(WEIGHT_SUFFIXES)})"
        )
    _check_shard_indexes(root)
    parameters, storage = _tensor_summary(weights)
    text = config.get("text_config")
    source = {**text, **config} if isinstance(text, dict) else config
    architectures = config.get("architectures")
    if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
        architecture: str | None = architectures[0]
    else:
        architecture = (
            config.get("model_type") if isinstance(config.get("model_type"), str) else None
        )
    quant = config.get("quantization_config")
    quantization = (
        str(quant.get("quant_method"))
        if isinstance(quant, dict) and quant.get("quant_method")
        else storage
    )
    return ModelFacts(
        format="transformers",
        architecture=architecture,
        parameters=parameters,
        quantization=quantization,
        context_length=_positive(source, "max_position_embeddings", "n_positions", "seq_length"),
        chat_template=_chat_template(root),
        experts=_positive(source, "num_local_experts", "num_experts", "n_routed_experts"),
        experts_used=_positive(source, "num_experts_per_tok", "num_experts_per_token"),
    )


def _chat_template(root: Path) -> bool | None:
    """Whether the tokenizer has a chat template (``None``: no tokenizer config says)."""
    tokenizer = root / "tokenizer_config.json"
    template = (root / "chat_template.jinja").is_file() or (root / "chat_template.json").is_file()
    if not template and tokenizer.is_file():
        template = bool(_json_object(tokenizer).get("chat_template"))
    return template if tokenizer.is_file() or template else None


def _onnx_genai_facts(root: Path) -> ModelFacts:
    config = _json_object(root / "genai_config.json")
    model = config.get("model")
    if not isinstance(model, dict):
        raise InvalidRequest("genai_config.json has no 'model' object")
    decoder = model.get("decoder") if isinstance(model.get("decoder"), dict) else {}
    filename = decoder.get("filename") if isinstance(decoder, dict) else None
    if not isinstance(filename, str) or not (root / filename).is_file():
        raise InvalidRequest(
            f"genai_config.json names decoder {filename!r}, which is missing from {root.name}"
        )
    kind = model.get("type")
    return ModelFacts(
        format=ONNX_GENAI,
        architecture=kind if isinstance(kind, str) else None,
        context_length=_positive(model, "context_length"),
        chat_template=_chat_template(root),
    )


def _diffusers_facts(root: Path) -> ModelFacts:
    index = _json_object(root / "model_index.json")
    name = index.get("_class_name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model_index.json names no pipeline class (_class_name)")
    for component, value in index.items():
        if component.startswith("_") or not isinstance(value, list) or None in value:
            continue
        if not (root / component).is_dir():
            raise InvalidRequest(
                f"model_index.json names component {component!r}, which is missing"
            )
    weights = _weights(root)
    if not weights:
        raise InvalidRequest(f"{root.name} has model_index.json but no weights")
    _check_shard_indexes(root)
    parameters, storage = _tensor_summary(weights)
    return ModelFacts(
        format="diffusers", architecture=name, parameters=parameters, quantization=storage
    )


def directory_facts(path: Path) -> ModelFacts:
    """Check a model directory and read its facts (see the module docstring).

    :raises werk.InvalidRequest: not a Diffusers or Transformers directory, or one with a
        broken config, a missing component, no weights, or an unreadable safetensors file.
    """
    if (path / "model_index.json").is_file():
        return _diffusers_facts(path)
    if (path / "genai_config.json").is_file():
        return _onnx_genai_facts(path)
    if (path / "config.json").is_file():
        return _transformers_facts(path)
    raise InvalidRequest(f"{path} is a directory without {', '.join(MARKERS)}")


def model_root(files: tuple[Path, ...]) -> Path | None:
    """The directory a directory model was imported from (the files' common folder), or
    ``None`` for a model of one file."""
    if len(files) < 2:
        return None
    root = Path(os.path.commonpath([str(f) for f in files]))
    return root if any((root / marker).is_file() for marker in MARKERS) else None


def inspect_model(spec: ModelSpec, descriptor: BackendDescriptor) -> ModelFacts | None:
    """What can be read about ``spec`` before it loads: the host's directory check (a
    Diffusers or Transformers directory), then the backend's own ``inspect``, whose facts win.

    :raises werk.InvalidRequest: either refuses the files (the reason says why).
    """
    root = model_root(spec.files)
    facts = directory_facts(root) if root is not None else None
    return descriptor.inspect_model(spec) or facts
