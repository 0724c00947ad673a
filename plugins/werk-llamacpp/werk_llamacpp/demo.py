"""A generated demo model: a LLaMA-architecture GGUF with random weights.

The file is fully determined by ``(seed, size)`` and the installed numpy/gguf versions: every tensor
draws from its own ``numpy.random.Generator`` seeded with ``[seed, tensor index]``, and GGUF carries
no timestamps, so the same seed yields a byte-identical file.

The vocabulary is a GPT-2 style byte-level BPE (``tokenizer.ggml.model = "gpt2"``): the 256 byte
tokens in GPT-2's byte-to-unicode mapping, a few merges (llama.cpp rejects an empty merges list and
gguf-py silently drops empty arrays), and the control tokens ``<|endoftext|>`` (bos and eos),
``<|im_start|>`` and ``<|im_end|>`` for a ChatML chat template. The output-projection rows of every
token that does not decode to printable ASCII are zero, so greedy decoding emits printable text (a
printable token's random logit beats the zeros).

Tensors are declared first and then generated and written one at a time, so the "medium" model
(~0.35 B parameters, ~0.7 GB in F16) never holds more than one tensor (~70 MB) in memory.
The file is written under a temporary name, fsynced and atomically renamed into place.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import gguf
import numpy as np
import numpy.typing as npt

from werk import InvalidRequest

DemoSize = Literal["tiny", "medium", "moe"]

EOS = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CONTROL_TOKENS = (EOS, IM_START, IM_END)
# Byte-level merges (left, right); each merged token is appended to the vocabulary in this order.
MERGES: tuple[tuple[bytes, bytes], ...] = ((b" ", b"t"), (b"h", b"e"), (b"i", b"n"), (b" t", b"he"))
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
INIT_STD = 0.02


@dataclass(frozen=True)
class Shape:
    """LLaMA hyper-parameters of one demo size."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    n_expert: int = 0
    """Experts per layer (0: a dense model); a MoE layer has ``ffn_*_exps`` tensors."""
    n_expert_used: int = 0


SHAPES: dict[str, Shape] = {
    # ~0.56 M parameters, ~1.1 MB.
    "tiny": Shape(n_embd=128, n_layer=3, n_head=4, n_head_kv=4, n_ff=256, n_ctx=4096),
    # TinyLlama-1.1B's layer shape, 8 of its 22 layers, a 263-token vocabulary: ~0.35 B parameters,
    # ~0.7 GB in F16. Sized for the prefix-value benchmark: a 2,000-token cold prefill took 25-29 s
    # on this 2-core machine (AVX2 build, other work running); all 22 layers took 93 s.
    "medium": Shape(n_embd=2048, n_layer=8, n_head=32, n_head_kv=4, n_ff=5632, n_ctx=4096),
    # A Mixtral-style MoE in llama.cpp's ``llama`` architecture: 8 experts, 2 used per token;
    # 24 MiB of expert tensors (``blk.N.ffn_{gate,up,down}_exps``) in a ~27 MB file, for CPU
    # expert page preparation.
    "moe": Shape(
        n_embd=256,
        n_layer=4,
        n_head=4,
        n_head_kv=4,
        n_ff=512,
        n_ctx=4096,
        n_expert=8,
        n_expert_used=2,
    ),
}


@dataclass(frozen=True)
class DemoModelInfo:
    """What :func:`create_demo_model` wrote.

    :param size: the size label (``tiny`` or ``medium``); the file's length is ``n_bytes``.
    """

    path: Path
    size: str
    sha256: str
    n_params: int
    seed: int
    n_bytes: int


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible mapping of the 256 byte values onto printable unicode characters."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    printable: list[bool]

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocab() -> Vocab:
    """Byte tokens (ids 0-255, in byte order), merged tokens, then the control tokens."""
    to_u = byte_to_unicode()

    def render(raw: bytes) -> str:
        return "".join(to_u[b] for b in raw)

    pieces = [bytes([b]) for b in range(256)] + [left + right for left, right in MERGES]
    tokens = [render(p) for p in pieces] + list(CONTROL_TOKENS)
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    types = [normal] * len(pieces) + [control] * len(CONTROL_TOKENS)
    merges = [f"{render(left)} {render(right)}" for left, right in MERGES]
    printable = [all(0x20 <= b <= 0x7E for b in p) for p in pieces] + [False] * len(CONTROL_TOKENS)
    return Vocab(tokens, types, merges, printable)


def _tensor_plan(shape: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """Tensor names and numpy shapes (rows, cols) in file order."""
    head_dim = shape.n_embd // shape.n_head
    n_kv = head_dim * shape.n_head_kv
    e, ff = shape.n_embd, shape.n_ff
    plan: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (n_vocab, e))]
    for i in range(shape.n_layer):
        plan += [
            (f"blk.{i}.attn_norm.weight", (e,)),
            (f"blk.{i}.attn_q.weight", (e, e)),
            (f"blk.{i}.attn_k.weight", (n_kv, e)),
            (f"blk.{i}.attn_v.weight", (n_kv, e)),
            (f"blk.{i}.attn_output.weight", (e, e)),
            (f"blk.{i}.ffn_norm.weight", (e,)),
        ]
        if shape.n_expert:
            x = shape.n_expert
            plan += [
                (f"blk.{i}.ffn_gate_inp.weight", (x, e)),
                (f"blk.{i}.ffn_gate_exps.weight", (x, ff, e)),
                (f"blk.{i}.ffn_up_exps.weight", (x, ff, e)),
                (f"blk.{i}.ffn_down_exps.weight", (x, e, ff)),
            ]
        else:
            plan += [
                (f"blk.{i}.ffn_gate.weight", (ff, e)),
                (f"blk.{i}.ffn_up.weight", (ff, e)),
                (f"blk.{i}.ffn_down.weight", (e, ff)),
            ]
    plan += [("output_norm.weight", (e,)), ("output.weight", (n_vocab, e))]
    return plan


def _tensors(
    plan: list[tuple[str, tuple[int, ...]]], seed: int, vocab: Vocab
) -> Iterator[npt.NDArray[Any]]:
    """Generate each tensor in plan order: norms are F32 ones, matrices F16 N(0, 0.02)."""
    for index, (name, dims) in enumerate(plan):
        if len(dims) == 1:
            yield np.ones(dims, dtype=np.float32)
            continue
        rng = np.random.default_rng([seed, index])
        values = rng.standard_normal(dims, dtype=np.float32)
        values *= INIT_STD
        if name == "output.weight":
            values[~np.asarray(vocab.printable)] = 0.0
        yield values.astype(np.float16)


def _add_metadata(
    writer: gguf.GGUFWriter, shape: Shape, vocab: Vocab, seed: int, size: str
) -> None:
    writer.add_name(f"werk-demo-{size}-seed{seed}")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    if shape.n_expert:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_bos_token_id(vocab.id_of(EOS))
    writer.add_eos_token_id(vocab.id_of(EOS))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def create_demo_model(path: Path, *, seed: int = 0, size: DemoSize = "tiny") -> DemoModelInfo:
    """Write the demo GGUF to ``path`` (atomically replacing any file there) and describe it.

    :raises InvalidRequest: an unknown size or a seed outside ``0 <= seed < 2**63``.
    """
    if size not in SHAPES:
        raise InvalidRequest(f"demo model size must be one of {sorted(SHAPES)}, not {size!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise InvalidRequest(f"demo model seed must be an integer in [0, 2**63), not {seed!r}")
    shape, vocab = SHAPES[size], build_vocab()
    plan = _tensor_plan(shape, len(vocab.tokens))
    path = Path(path).absolute()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(None, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    try:
        _add_metadata(writer, shape, vocab, seed, size)
        for name, dims in plan:
            is_norm = len(dims) == 1
            dtype, itemsize = (np.dtype(np.float32), 4) if is_norm else (np.dtype(np.float16), 2)
            writer.add_tensor_info(name, dims, dtype, int(np.prod(dims)) * itemsize)
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in _tensors(plan, seed, vocab):
            writer.write_tensor_data(tensor)
        writer.close()
        _fsync_path(tmp)
        os.replace(tmp, path)
        _fsync_path(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    n_params = sum(int(np.prod(dims)) for _, dims in plan)
    return DemoModelInfo(path, size, _sha256(path), n_params, seed, path.stat().st_size)


def main(argv: list[str] | None = None) -> int:
    """``python -m werk_llamacpp.demo OUT.gguf [--seed N] [--size tiny|medium]``; prints JSON."""
    parser = argparse.ArgumentParser(prog="python -m werk_llamacpp.demo", description=__doc__)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", choices=get_args(DemoSize), default="tiny")
    args = parser.parse_args(argv)
    info = create_demo_model(args.out, seed=args.seed, size=args.size)
    print(json.dumps({**asdict(info), "path": str(info.path)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
