"""The llama.cpp memory requirement from a real GGUF header and the child's arguments
(werk_llamacpp.requirement); ``benchmarks/llamacpp_memory_requirement.py`` compares it with the
observed peak RSS of a real child."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
from test_llamacpp_process_support import (
    demo_model,
    inspection_stub,
    needs_llama_server,
    spec_for,
)
from werk_llamacpp.requirement import (
    COMPUTE_FIXED_BYTES,
    offload_reason,
    requirement_for,
    runtime_requirement,
)

from werk import InvalidRequest


def header(path: Path) -> dict[str, int]:
    reader = gguf.GGUFReader(str(path))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def value(key: str) -> int:
        field = reader.fields[f"{arch}.{key}"]
        return int(field.parts[field.data[0]][0])

    return {
        "n_layer": value("block_count"),
        "n_embd": value("embedding_length"),
        "n_head": value("attention.head_count"),
        "n_head_kv": value("attention.head_count_kv"),
        "n_ff": value("feed_forward_length"),
        "n_ctx_train": value("context_length"),
        "weights": sum(int(t.n_bytes) for t in reader.tensors),
    }


def test_weights_kv_and_compute_follow_the_documented_formula(tmp_path: Path) -> None:
    model = demo_model(tmp_path)
    h = header(model)
    head_dim = h["n_embd"] // h["n_head"]
    req = requirement_for(model, ["-m", str(model), "-np", "5", "-c", "20480"])
    assert req.weights_bytes == h["weights"] and 0 < req.weights_bytes <= model.stat().st_size
    per_token = h["n_layer"] * 2 * h["n_head_kv"] * head_dim * 2  # K and V, f16
    assert req.kv_cache_bytes == 20480 * per_token
    assert req.compute_bytes > COMPUTE_FIXED_BYTES
    assert req.total_bytes == req.weights_bytes + req.kv_cache_bytes + req.compute_bytes
    # The last -c wins (as in llama.cpp's parser); without one the trained context applies.
    later = requirement_for(model, ["-c", "20480", "--ctx-size", "1024"])
    assert later.kv_cache_bytes == 1024 * per_token
    trained = requirement_for(model, [])
    assert trained.kv_cache_bytes == h["n_ctx_train"] * per_token


def test_cache_types_and_micro_batch_change_the_requirement(tmp_path: Path) -> None:
    model = demo_model(tmp_path)
    f16 = requirement_for(model, ["-c", "4096"])
    q8 = requirement_for(model, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"])
    f32 = requirement_for(model, ["-c", "4096", "--cache-type-k", "f32", "--cache-type-v", "f32"])
    assert q8.kv_cache_bytes == f16.kv_cache_bytes * 34 // 64
    assert f32.kv_cache_bytes == 2 * f16.kv_cache_bytes
    bigger = requirement_for(model, ["-c", "4096", "-ub", "2048"])
    assert bigger.compute_bytes > f16.compute_bytes and bigger.kv_cache_bytes == f16.kv_cache_bytes


@pytest.mark.parametrize(
    "argv",
    [["-ctk", "q3_weird"], ["-c", "many"], ["-c", "0"], ["-ub", "-4"]],
    ids=["unknown cache type", "non-numeric -c", "zero -c", "negative -ub"],
)
def test_unusable_arguments_are_refused(tmp_path: Path, argv: list[str]) -> None:
    with pytest.raises(InvalidRequest):
        requirement_for(demo_model(tmp_path), argv)


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + b"\x00" * 60)
    with pytest.raises(InvalidRequest, match=r"fake\.gguf"):
        requirement_for(fake, [])


def test_a_truncated_gguf_is_refused(tmp_path: Path) -> None:
    model = demo_model(tmp_path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model.read_bytes()[:200])
    with pytest.raises(InvalidRequest, match="not a readable GGUF"):
        requirement_for(cut, [])


def test_a_bound_is_given_only_when_the_child_cannot_offload() -> None:
    cpu, unknown = inspection_stub(()), inspection_stub(None)
    gpu = inspection_stub(("CUDA0: H200",))
    assert offload_reason([], cpu) is None
    assert offload_reason([], gpu) == "llama-server may offload to CUDA0: H200"
    assert offload_reason([], unknown) is not None
    for argv in (["-ngl", "0"], ["--n-gpu-layers", "0"], ["--device", "none"]):
        assert offload_reason(argv, gpu) is None
        assert offload_reason(argv, unknown) is None
    assert offload_reason(["-ngl", "0", "-ngl", "99"], gpu) is not None  # the last one wins


@needs_llama_server
@pytest.mark.anyio
async def test_the_plugin_requirement_is_the_formula_for_the_arguments_it_starts_with(
    tmp_path: Path,
) -> None:
    model = demo_model(tmp_path)
    spec = spec_for(model, {"parallel": 2, "ctx_size": 1024})
    requirement = await runtime_requirement(spec)
    assert requirement is not None and requirement.tier == "ram"
    expected = requirement_for(model, ["-np", "3", "-c", str(3 * 1024)])  # 2 + the state slot
    assert requirement.nbytes == expected.total_bytes
    assert dict(requirement.parts) == {
        "weights": expected.weights_bytes,
        "kv cache": expected.kv_cache_bytes,
        "compute": expected.compute_bytes,
    }
    missing = spec_for(model, {"llama_server": str(tmp_path / "no-such-llama-server")})
    assert await runtime_requirement(missing) is None  # the start reports the real reason


def test_header_facts_are_read_once_per_file_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start of an unchanged model reads no GGUF header (no gguf/numpy import); a change of
    the file's identity, or a corrupt cache record, reads it again."""
    import json
    import os

    from werk_llamacpp import requirement as module

    monkeypatch.setenv("WERK_HOME", str(tmp_path / "home"))
    model = demo_model(tmp_path)
    reads: list[Path] = []
    real = module.read_header_facts

    def counted(path: Path) -> module.HeaderFacts:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(module, "read_header_facts", counted)
    argv = ["-c", "4096"]
    first = requirement_for(model, argv)
    assert requirement_for(model, argv) == first and len(reads) == 1
    [record] = (tmp_path / "home" / "inspections" / "llamacpp").glob("gguf-*.json")
    assert record.stat().st_mode & 0o777 == 0o600
    # The same bytes under a new mtime are another identity: read again (and still equal).
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert requirement_for(model, argv) == first and len(reads) == 2
    # A corrupt record for this very identity is ignored, never trusted.
    [cached] = (p for p in record.parent.glob("gguf-*.json") if p != record)
    data = json.loads(cached.read_text())
    data["facts"]["n_layer"] = "many"
    cached.write_text(json.dumps(data))
    assert requirement_for(model, argv) == first and len(reads) == 3
