"""What llama.cpp's ``inspect`` reads from a GGUF before it loads: ``werk models show`` and the
refusal of a file that is not a usable GGUF at ``werk models import`` (the real CLI)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_llamacpp_process_support import (
    WERK,
    create_demo,
    demo_model,
    needs_llama_server,
    split_demo_model,
    werk_env,
    werk_serve,
)
from werk_llamacpp.demo import create_demo_model
from werk_llamacpp.model_facts import inspect_model, quantization_name
from werk_llamacpp.requirement import header_facts, requirement_for

from werk import InvalidRequest, ModelSpec


def werk(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WERK), *args], env=werk_env(home), capture_output=True, text=True, timeout=120
    )


def spec(path: Path, **options: object) -> ModelSpec:
    return ModelSpec(
        id="m", backend="llamacpp", identity="sha256:x", files=(path,), options=options
    )


def test_the_facts_of_a_mixture_of_experts_and_its_estimate(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    create_demo_model(path, seed=0, size="moe")
    facts = inspect_model(spec(path, ctx_size=512, parallel=2))
    assert (facts.format, facts.architecture, facts.experts) == ("gguf", "llama", 8)
    assert facts.experts_used is not None and 0 < facts.experts_used <= 8
    assert facts.parameters is not None and facts.parameters > 8 * 512 * 256 * 3 * 4
    assert facts.memory is not None
    # The estimate is the one a start reserves: one slot's context × (parallel + state slot).
    expected = requirement_for(path, ["-c", str(512 * 3)])
    assert facts.memory.nbytes == expected.total_bytes
    assert dict(facts.memory.parts)["kv cache"] == expected.kv_cache_bytes
    assert "512 per slot × 3 slots" in facts.memory_basis
    # Native arguments count: a q8_0 KV cache is smaller than the f16 default.
    q8 = inspect_model(spec(path, ctx_size=512, parallel=2, native_args=["-ctk", "q8_0"]))
    assert q8.memory is not None and q8.memory.nbytes < facts.memory.nbytes


def test_quantization_names_follow_llama_cpp() -> None:
    assert quantization_name(1) == "F16"
    assert quantization_name(15) == "Q4_K_M"
    assert quantization_name(None) is None
    assert quantization_name(9999) == "type 9999"


@pytest.mark.parametrize(
    "content",
    [b"junk", b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64, b""],
    ids=["text", "cut-header", "empty"],
)
def test_a_file_that_is_not_a_usable_gguf_is_refused(tmp_path: Path, content: bytes) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(content)
    with pytest.raises(InvalidRequest, match=r"junk\.gguf is not a readable GGUF file"):
        inspect_model(spec(junk))


def test_import_refuses_junk_and_show_prints_the_facts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a model")
    refused = werk(home, "models", "import", str(junk), "--id", "junk")
    assert refused.returncode == 1
    assert "junk.gguf is not a readable GGUF file" in refused.stderr
    assert not (home / "models" / "junk.json").exists()
    create_demo(home)
    shown = werk(home, "models", "show", "demo")
    assert shown.returncode == 0, shown.stderr
    lines = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in shown.stdout.splitlines())
    assert lines["architecture"] == "llama"
    assert lines["quantisation"] == "F16"
    assert lines["chat template"] == "yes"
    assert lines["experts"] == "not a mixture of experts"
    assert "weights" in lines["memory"] and "kv cache" in lines["memory"]
    assert lines["this machine"].startswith(("fits", "does not fit"))
    as_json = json.loads(werk(home, "models", "show", "demo", "--json").stdout)
    facts = as_json["facts"]
    assert facts["context_length"] > 0 and facts["parameters"] > 0
    assert sum(n for _, n in facts["memory"]["parts"]) == facts["memory"]["nbytes"]
    assert as_json["memory"]["fits"] == (
        facts["memory"]["nbytes"] <= as_json["memory"]["available_bytes"]
    )
    missing = werk(home, "models", "show", "nope")
    assert missing.returncode == 1 and "not imported" in missing.stderr


def test_a_split_gguf_is_imported_with_every_part_and_counted_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp starts on the first part and reads the others beside it; the model's identity,
    parameters and weights cover every part, and a record of its header holds only while no
    part changed."""
    first, second = split_demo_model(tmp_path / "split")
    whole = inspect_model(spec(demo_model(tmp_path / "split" / "whole")))
    home = tmp_path / "home"
    alone = werk(home, "models", "import", str(first), "--id", "split")
    assert alone.returncode == 1
    assert "first of 2 files of a split GGUF: import every part" in alone.stderr
    assert f"werk models import {first} {second}" in alone.stderr
    wrong = werk(home, "models", "import", str(second), "--id", "split")
    assert wrong.returncode == 1 and "give its first part" in wrong.stderr, wrong.stderr
    done = werk(home, "models", "import", str(first), str(second), "--id", "split", "--json")
    assert done.returncode == 0, done.stderr
    assert [Path(f["path"]).name for f in json.loads(done.stdout)["files"]] == [
        first.name,
        second.name,
    ]
    shown = json.loads(werk(home, "models", "show", "split", "--json").stdout)["facts"]
    assert shown["parameters"] == whole.parameters
    assert whole.memory is not None
    assert (
        dict(map(tuple, shown["memory"]["parts"]))["weights"] == dict(whole.memory.parts)["weights"]
    )
    # A changed part: the model's identity no longer holds (the host says so) …
    second.write_bytes(b"not a gguf any more")
    again = werk(home, "models", "show", "split")
    assert again.returncode == 1 and f"{second.name} changed since import" in again.stderr
    # … and the header record cached for the first part is not used: every part is read again.
    monkeypatch.setenv("WERK_HOME", str(home))
    with pytest.raises(InvalidRequest, match=f"{second.name} \\(a part of {first.name}\\)"):
        header_facts(first)


@needs_llama_server
def test_a_split_gguf_serves_a_chat(tmp_path: Path) -> None:
    first, second = split_demo_model(tmp_path / "split")
    home = tmp_path / "home"
    done = werk(home, "models", "import", str(first), str(second), "--id", "split")
    assert done.returncode == 0, done.stderr
    with werk_serve(home, ("--model", "split")) as served, served.client() as client:
        chat = {"model": "split", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        answer = client.post("/v1/chat/completions", json=chat)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] > 0
