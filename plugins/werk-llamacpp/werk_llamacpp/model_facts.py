"""``BackendDescriptor.inspect`` for llama.cpp: what a GGUF file states, read without loading it.

The header and tensor directory are parsed by ``gguf.GGUFReader`` (the same parse the memory
requirement uses, :func:`werk_llamacpp.requirement.read_header_facts`), so a file that is not a
GGUF llama.cpp can size is refused at ``werk models import`` with the reason instead of when a
server first starts it. The memory estimate is :func:`requirement_for` at the model's own
options: the context of one slot times every slot Werk starts (``parallel`` plus the state
slots), the cache types and micro-batch of its native arguments. It is the CPU figure: with an
accelerator llama.cpp may hold part of it in device memory instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from werk import InvalidRequest, ModelFacts, ModelSpec, RuntimeRequirement

from .args import last_value, model_file, parse_options, reserved_state_slots
from .requirement import _field, header_facts, requirement_for, split_parts

__all__ = ["inspect_model", "quantization_name"]


def quantization_name(file_type: object) -> str | None:
    """``general.file_type`` as llama.cpp names it (``Q4_K_M``, ``F16``); ``None`` if absent."""
    import gguf

    if not isinstance(file_type, int):
        return None
    try:
        name = gguf.LlamaFileType(file_type).name
    except ValueError:
        return f"type {file_type}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def _header(reader: Any, arch: str, parts: list[Any]) -> dict[str, Any]:
    experts = _field(reader, f"{arch}.expert_count")
    return {
        "parameters": sum(int(t.n_elements) for r in (reader, *parts) for t in r.tensors),
        "quantization": quantization_name(_field(reader, "general.file_type")),
        "chat_template": reader.fields.get("tokenizer.chat_template") is not None,
        "experts": experts if isinstance(experts, int) and experts > 0 else None,
        "experts_used": _field(reader, f"{arch}.expert_used_count") if experts else None,
    }


def inspect_model(spec: ModelSpec) -> ModelFacts:
    """The facts of ``spec``'s GGUF file and its memory estimate at the model's options.

    :raises werk.InvalidRequest: not a readable GGUF, without the metadata llama.cpp needs, or
        model options llama.cpp would refuse.
    """
    import gguf

    path: Path = model_file(spec)
    # Refuses a file that is not a usable GGUF, with why; cached per file identity, so the
    # estimate below reads no header again and the display fields are the one more parse.
    header = header_facts(path)
    reader = gguf.GGUFReader(str(path))
    arch = str(_field(reader, "general.architecture"))
    parts = split_parts(path, reader)
    recorded = {Path(f).absolute() for f in spec.files}
    missing = [part for part in parts if part.absolute() not in recorded]
    if missing:
        every = " ".join(str(p) for p in (path, *parts))
        raise InvalidRequest(
            f"{path.name} is the first of {len(parts) + 1} files of a split GGUF: import every "
            f"part (werk models import {every} --id …), so that the model's identity covers "
            "them all"
        )
    options = parse_options(spec.options)
    slots = options.parallel + reserved_state_slots(options)
    argv = [*options.native_args]
    if last_value(argv, "-c", "--ctx-size") is None:
        argv = ["-c", str(options.ctx_size * slots), *argv]
    need = requirement_for(path, argv)
    basis = (
        f"context {last_value(argv, '-c', '--ctx-size')} tokens "
        f"({options.ctx_size} per slot × {slots} slots), KV cache "
        f"{last_value(argv, '-ctk', '--cache-type-k') or 'f16'}, CPU only"
    )
    return ModelFacts(
        format="gguf",
        architecture=arch,
        context_length=header.context_length,
        memory=RuntimeRequirement(
            nbytes=need.total_bytes,
            parts=(
                ("weights", need.weights_bytes),
                ("kv cache", need.kv_cache_bytes),
                ("compute", need.compute_bytes),
            ),
        ),
        memory_basis=basis,
        **_header(reader, arch, [gguf.GGUFReader(str(p)) for p in parts]),
    )
