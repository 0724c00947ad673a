"""How much host memory one llama-server child needs: computed before it is started.

Issue 16's first piece: the requirement an admission check can reserve. It comes from the GGUF
header (read through ``gguf.GGUFReader``, which maps the file and parses only the metadata and
tensor directory; importing it and numpy is most of the ~0.1 s this takes) and from the child's
effective arguments. The header's facts are cached on disk per file identity
(:func:`header_facts`), so the start of an unchanged model reads no header:

``total = weights + kv_cache + compute``

* **weights**: the sum of the tensor data sizes in the tensor directory (llama.cpp maps the
  file; every page it reads becomes resident).
* **kv_cache**: ``n_ctx × n_layer × (n_embd_k_gqa × size(type_k) + n_embd_v_gqa × size(type_v))``
  with ``n_ctx`` the child's whole ``-c`` (Werk passes the per-slot context times the slot
  count, state slot included), ``n_embd_k_gqa = n_head_kv × key_length`` (``key_length`` defaults
  to ``n_embd / n_head``; ``value_length`` likewise) and the cache types of ``-ctk``/``-ctv``
  (default ``f16``). Quantized cache types count their block size (``q8_0``: 34 bytes per 32
  values).
* **compute**: a margin for llama.cpp's compute buffers and the server's own state:
  ``64 MiB + n_ubatch × (n_vocab + n_ff + 4 × n_embd) × 4 bytes`` (``-ub``, default 512): the
  logits, the feed-forward and attention activations of one micro-batch in f32, plus the
  process's fixed overhead (threads, HTTP server, tokenizer).

**Where it applies.** The whole requirement is host memory (``ram``) only when the child cannot
offload to an accelerator: the executable's ``--list-devices`` names no device (a CPU-only
build), or the arguments say ``-ngl 0`` / ``--device none``. Otherwise
:func:`runtime_requirement` gives no bound (``None``: the start is not accounted) rather than a
wrong one; a split between RAM and VRAM is not computed yet. llama.cpp allocates the KV cache of
every slot at start, so a restore or a decode never grows what the child holds: the requirement
at load covers them.

``benchmarks/llamacpp_memory_requirement.py`` prints this estimate next to the child's observed
peak RSS for the tiny and the medium demo models. Only the ``llama`` family's key names are read
(``<arch>.block_count`` …, for the architecture the header names); a header without them is
refused (``invalid_request``) rather than guessed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from werk import InvalidRequest, ModelSpec, RuntimeRequirement

from .args import build_args, last_value, model_file, parse_options
from .executable import locate_llama_server
from .inspect import FileIdentity, Inspection, inspect_executable, load_record, store_record

__all__ = [
    "COMPUTE_FIXED_BYTES",
    "HeaderFacts",
    "MemoryRequirement",
    "header_facts",
    "offload_reason",
    "requirement_for",
    "runtime_requirement",
    "split_parts",
]

log = logging.getLogger("werk.llamacpp")

COMPUTE_FIXED_BYTES = 64 * 1024 * 1024
DEFAULT_UBATCH = 512
MAX_REQUIREMENT_BYTES = 1 << 50
"""A requirement above 1 PiB means a corrupt header, not a model."""

_CACHE_TYPE_BYTES = {
    # bytes per value: block size over values per block (ggml's block layouts)
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}


class MemoryRequirement(msgspec.Struct, frozen=True):
    """Bytes one child needs (see the module docstring for each part)."""

    weights_bytes: int
    kv_cache_bytes: int
    compute_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.compute_bytes


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None or not field.data:
        return None
    value = field.parts[field.data[0]]
    if len(value) == 1:
        return value[0].item()
    return bytes(value).decode("utf-8", "replace")


def _positive_int(reader: Any, key: str, default: int | None = None) -> int:
    value = _field(reader, key)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InvalidRequest(f"the GGUF header has no usable {key!r}")
    return value


def _cache_type_bytes(argv: Sequence[str], *spellings: str) -> float:
    name = (last_value(argv, *spellings) or "f16").lower()
    size = _CACHE_TYPE_BYTES.get(name)
    if size is None:
        raise InvalidRequest(f"unknown KV cache type {name!r} in the llama-server arguments")
    return size


class HeaderFacts(msgspec.Struct, frozen=True):
    """What the formula needs from one GGUF header (cached per file identity)."""

    n_layer: int
    n_embd: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_ff: int
    n_vocab: int
    context_length: int | None
    weights_bytes: int
    """The tensor bytes of the model: of every part, for a split GGUF."""
    expert_ranges: tuple[tuple[int, int], ...] = ()
    """``(offset, length)`` of each expert tensor (name with ``_exps.``) in the file (the
    first part only, for a split GGUF)."""
    parts: tuple[FileIdentity, ...] = ()
    """The other parts of a split GGUF as they were read (a cached record is used only while
    every part is unchanged)."""


HEADER_CACHE_VERSION = 2
_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


def split_parts(model: Path, reader: Any) -> list[Path]:
    """The other files of a split GGUF whose first part is ``model`` (``[]`` for a whole
    file), found as llama.cpp finds them: ``PREFIX-00002-of-0000N.gguf`` … beside it.

    :raises werk.InvalidRequest: ``model`` is not the first part, is not named as llama.cpp
        expects, or a part is missing.
    """
    count = _field(reader, "split.count")
    if not isinstance(count, int) or count <= 1:
        return []
    name = _SPLIT_NAME.match(model.name)
    if _field(reader, "split.no") not in (0, None) or name is None or int(name.group(2)) != 1:
        raise InvalidRequest(
            f"{model.name} is part of a split GGUF of {count} files: give its first part, "
            "named PREFIX-00001-of-NNNNN.gguf"
        )
    prefix = name.group(1)
    parts = [model.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1)]
    for part in parts:
        if not part.is_file():
            raise InvalidRequest(
                f"{model.name} is part 1 of a split GGUF of {count} files; {part.name} is missing "
                "beside it"
            )
    return parts


HEADER_CACHE_PREFIX = "gguf-"


def read_header_facts(model: Path) -> HeaderFacts:
    """Parse ``model``'s GGUF header (``gguf.GGUFReader``: numpy and the whole tensor
    directory, ~0.1 s of CPU even for the tiny demo).

    :raises werk.InvalidRequest: not a readable GGUF, or without the metadata the formula needs.
    """
    import gguf  # imported when used: a large module, only needed before a start

    try:
        reader = gguf.GGUFReader(str(model))
    except Exception as exc:  # any parse failure of an untrusted file: refused, never a crash
        raise InvalidRequest(
            f"{model.name} is not a readable GGUF file ({type(exc).__name__})"
        ) from None
    parts = split_parts(model, reader)  # before the metadata: only the first part has it
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise InvalidRequest("the GGUF header names no architecture")
    n_embd = _positive_int(reader, f"{arch}.embedding_length")
    n_head = _positive_int(reader, f"{arch}.attention.head_count")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    try:
        context_length: int | None = _positive_int(reader, f"{arch}.context_length")
    except InvalidRequest:
        context_length = None  # needed only when the arguments carry no -c
    weights = sum(int(tensor.n_bytes) for tensor in reader.tensors)
    identities = tuple(FileIdentity.of(part) for part in parts)  # before reading: a part
    # changed while it was read is then read again next time
    for part in parts:
        try:
            weights += sum(int(t.n_bytes) for t in gguf.GGUFReader(str(part)).tensors)
        except Exception as exc:
            raise InvalidRequest(
                f"{part.name} (a part of {model.name}) is not a readable GGUF file "
                f"({type(exc).__name__})"
            ) from None
    return HeaderFacts(
        n_layer=_positive_int(reader, f"{arch}.block_count"),
        n_embd=n_embd,
        n_head_kv=_positive_int(reader, f"{arch}.attention.head_count_kv", n_head),
        key_length=_positive_int(reader, f"{arch}.attention.key_length", n_embd // n_head),
        value_length=_positive_int(reader, f"{arch}.attention.value_length", n_embd // n_head),
        n_ff=_positive_int(reader, f"{arch}.feed_forward_length", 4 * n_embd),
        n_vocab=_positive_int(reader, f"{arch}.vocab_size", len(tokens.data) if tokens else None),
        context_length=context_length,
        weights_bytes=weights,
        parts=identities,
        expert_ranges=tuple(
            (int(t.data_offset), int(t.n_bytes))
            for t in reader.tensors
            if "_exps." in t.name and int(t.n_bytes) > 0
        ),
    )


def _facts_from_record(facts: object) -> HeaderFacts | None:
    """A cached record's facts, or ``None`` when any of them is not what was stored."""
    if not isinstance(facts, dict):
        return None
    ranges = facts.get("expert_ranges")
    if not isinstance(ranges, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(_count(v) for v in r) for r in ranges
    ):
        return None
    try:
        parts = msgspec.convert(facts.get("parts", []), tuple[FileIdentity, ...])
        cached = HeaderFacts(
            **{**facts, "expert_ranges": tuple(tuple(r) for r in ranges), "parts": parts}
        )
    except (TypeError, msgspec.ValidationError):
        return None
    for part in parts:  # a split model's record holds while none of its parts changed
        try:
            if FileIdentity.of(Path(part.path)) != part:
                return None
        except OSError:
            return None
    for name, value in msgspec.structs.asdict(cached).items():
        if name in ("expert_ranges", "parts") or (name == "context_length" and value is None):
            continue
        if not _count(value) or value == 0:
            return None
    return cached


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def header_facts(model: Path) -> HeaderFacts:
    """:func:`read_header_facts`, cached on disk per file identity (path, device, inode, size,
    mtime, ctime; ``WERK_HOME/inspections/llamacpp/gguf-*.json``): a start of an unchanged
    model file reads no header. Any change of the file's identity reads it again."""
    identity = FileIdentity.of(model)
    record = load_record(identity, prefix=HEADER_CACHE_PREFIX, version=HEADER_CACHE_VERSION)
    cached = _facts_from_record(record.get("facts")) if record is not None else None
    if cached is not None:
        return cached
    read = read_header_facts(model)
    if FileIdentity.of(model) == identity:  # not replaced while it was read
        store_record(
            identity,
            {"facts": msgspec.to_builtins(read)},
            prefix=HEADER_CACHE_PREFIX,
            version=HEADER_CACHE_VERSION,
        )
    return read


def requirement_for(model: Path, argv: Sequence[str]) -> MemoryRequirement:
    """The requirement of a child started with ``argv`` on the GGUF file ``model``.

    :raises werk.InvalidRequest: the file is not a readable GGUF with the needed metadata, or
        the arguments name an unknown cache type or an unusable context.
    """
    facts = header_facts(model)
    ctx = last_value(argv, "-c", "--ctx-size")
    ubatch = last_value(argv, "-ub", "--ubatch-size")
    try:
        n_ctx = int(ctx) if ctx is not None else facts.context_length
        n_ubatch = int(ubatch) if ubatch is not None else DEFAULT_UBATCH
    except ValueError:
        raise InvalidRequest("the llama-server arguments carry a non-numeric -c or -ub") from None
    if n_ctx is None:
        raise InvalidRequest("the GGUF header has no usable context length and no -c is given")
    if n_ctx <= 0 or n_ubatch <= 0:
        raise InvalidRequest("the llama-server arguments carry a non-positive -c or -ub")
    per_token_layer = facts.n_head_kv * facts.key_length * _cache_type_bytes(
        argv, "-ctk", "--cache-type-k"
    ) + facts.n_head_kv * facts.value_length * _cache_type_bytes(argv, "-ctv", "--cache-type-v")
    kv = int(n_ctx * facts.n_layer * per_token_layer)
    compute = COMPUTE_FIXED_BYTES + n_ubatch * (facts.n_vocab + facts.n_ff + 4 * facts.n_embd) * 4
    requirement = MemoryRequirement(facts.weights_bytes, kv, compute)
    if not 0 < requirement.total_bytes <= MAX_REQUIREMENT_BYTES:
        raise InvalidRequest("the GGUF header describes an implausible model size")
    return requirement


def offload_reason(argv: Sequence[str], inspection: Inspection) -> str | None:
    """Why the child may hold memory outside the host (``None``: it runs on the CPU alone)."""
    layers = last_value(argv, "-ngl", "--gpu-layers", "--n-gpu-layers")
    device = last_value(argv, "-dev", "--device")
    if layers == "0" or (device is not None and device.lower() == "none"):
        return None
    if inspection.devices == ():
        return None
    if inspection.devices is None:
        return "llama-server --list-devices did not list its devices"
    return f"llama-server may offload to {', '.join(inspection.devices)}"


async def runtime_requirement(spec: ModelSpec) -> RuntimeRequirement | None:
    """``BackendDescriptor.requirement``: the host memory the child for ``spec`` will need,
    from the same arguments the start builds; ``None`` when it may offload (see above) or no
    executable is found (the start then fails with its own reason).

    :raises werk.InvalidRequest: bad model options or native arguments, or a GGUF header
        without the metadata the formula needs.
    """
    import anyio

    located = locate_llama_server(spec.options)
    if located.path is None:
        return None
    options = parse_options(spec.options)
    model = model_file(spec)
    inspection = await inspect_executable(located.path)
    built = build_args(
        inspection,
        model=model,
        port=1,
        api_key="-",
        slot_dir=Path("-"),
        alias=spec.id,
        options=options,
    )
    reason = offload_reason(built.argv, inspection)
    if reason is not None:
        log.info("no memory bound for model %s: %s", spec.id, reason)
        return None
    need = await anyio.to_thread.run_sync(requirement_for, model, built.argv)
    return RuntimeRequirement(
        nbytes=need.total_bytes,
        parts=(
            ("weights", need.weights_bytes),
            ("kv cache", need.kv_cache_bytes),
            ("compute", need.compute_bytes),
        ),
    )
