"""Models other tools downloaded, imported in place and served by a real llama-server: an Ollama
store (layout of ollama/ollama ``server/modelpath.go``: ``manifests/<registry>/<namespace>/
<model>/<tag>`` naming the GGUF layer, ``blobs/sha256-<hex>``), a Hugging Face cache (the
layout ``huggingface_hub`` writes: ``models--owner--repo/{blobs,snapshots/<commit>,refs}``,
read back by its own ``scan_cache_dir``), and an LM Studio models folder. The GGUF in each is
the generated demo model."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from test_llamacpp_process_support import (
    WERK,
    demo_model,
    needs_llama_server,
    werk_env,
    werk_serve,
)

pytestmark = pytest.mark.slow

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def ollama_store(root: Path, gguf: Path, name: str = "tiny", tag: str = "latest") -> Path:
    data = gguf.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    template = b"{{ .Prompt }}"
    template_digest = hashlib.sha256(template).hexdigest()
    (root / "blobs" / f"sha256-{template_digest}").write_bytes(template)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "layers": [
            {
                "mediaType": "application/vnd.ollama.image.model",
                "digest": f"sha256:{digest}",
                "size": len(data),
            },
            {
                "mediaType": "application/vnd.ollama.image.template",
                "digest": f"sha256:{template_digest}",
                "size": len(template),
            },
        ],
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return root


def hf_cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """A model repository in the cache, as ``hf_hub_download`` leaves it."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        etag = hashlib.sha256(data).hexdigest()
        (folder / "blobs").mkdir(exist_ok=True)
        (folder / "blobs" / etag).write_bytes(data)
        link = folder / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../blobs") / etag)
    return root


def werk(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(WERK), *args], env=werk_env(home, env), capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, str]:
    gguf = demo_model(tmp_path / "demo")
    fake_home = tmp_path / "user"
    lmstudio = fake_home / ".lmstudio" / "models" / "acme" / "Tiny-GGUF"
    lmstudio.mkdir(parents=True)
    shutil.copy(gguf, lmstudio / "tiny-f16.gguf")
    return {
        "OLLAMA_MODELS": str(ollama_store(tmp_path / "ollama", gguf)),
        "HF_HUB_CACHE": str(
            hf_cache(tmp_path / "hf", "acme/Tiny-GGUF", {"tiny-F16.gguf": gguf.read_bytes()})
        ),
        "HOME": str(fake_home),
    }


def test_discover_lists_every_store(tmp_path: Path, stores: dict[str, str]) -> None:
    home = tmp_path / "home"
    listed = werk(home, stores, "models", "discover", "--json")
    assert listed.returncode == 0, listed.stderr
    found = {(m["store"], m["name"], m["format"]) for m in json.loads(listed.stdout)["models"]}
    assert found == {
        ("ollama", "tiny:latest", "gguf"),
        ("hf-cache", "acme/Tiny-GGUF:tiny-F16.gguf", "gguf"),
        ("lmstudio", "acme/Tiny-GGUF/tiny-f16.gguf", "gguf"),
    }
    table = werk(home, stores, "models", "discover")
    assert "tiny:latest" in table.stdout and "werk models import --from" in table.stdout
    unknown = werk(home, stores, "models", "discover", "--from", "nowhere")
    assert unknown.returncode == 1 and "ollama, hf-cache, lmstudio" in unknown.stderr
    missing = werk(home, stores, "models", "import", "--from", "ollama", "absent")
    assert missing.returncode == 1 and "ollama has no model 'absent' (it has: tiny:latest)" in (
        missing.stderr
    )


def test_an_ollama_manifest_naming_a_bad_digest_is_skipped(
    tmp_path: Path, stores: dict[str, str]
) -> None:
    root = Path(stores["OLLAMA_MODELS"])
    bad = root / "manifests" / "registry.ollama.ai" / "library" / "evil" / "latest"
    bad.parent.mkdir(parents=True)
    layer = {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:../../etc"}
    bad.write_text(json.dumps({"layers": [layer]}))
    (root / "manifests" / "registry.ollama.ai" / "library" / "junk").mkdir()
    (root / "manifests" / "registry.ollama.ai" / "library" / "junk" / "latest").write_text("{")
    listed = werk(tmp_path / "home", stores, "models", "discover", "--from", "ollama", "--json")
    assert [m["name"] for m in json.loads(listed.stdout)["models"]] == ["tiny:latest"]


@needs_llama_server
def test_models_from_ollama_and_the_hf_cache_serve_a_chat(
    tmp_path: Path, stores: dict[str, str]
) -> None:
    home = tmp_path / "home"
    imports = {
        "tiny-latest": ("ollama", "tiny"),  # Ollama's `tiny` is `tiny:latest`
        "Tiny-GGUF-tiny-F16": ("hf-cache", "acme/Tiny-GGUF:tiny-F16.gguf"),
        "lm": ("lmstudio", "acme/Tiny-GGUF/tiny-f16.gguf"),
    }
    where = {"ollama": "OLLAMA_MODELS", "hf-cache": "HF_HUB_CACHE", "lmstudio": "HOME"}
    for model_id, (store, name) in imports.items():
        args = ["models", "import", "--from", store, name, "--json"]
        done = werk(home, stores, *(args if model_id != "lm" else [*args, "--id", "lm"]))
        assert done.returncode == 0, done.stderr
        manifest = json.loads(done.stdout)
        assert (manifest["id"], manifest["backend"]) == (model_id, "llamacpp")
        # Referenced in place, where the other tool keeps it.
        assert Path(manifest["files"][0]["path"]).is_relative_to(stores[where[store]])
    ids = ("--model", "tiny-latest", "--model", "Tiny-GGUF-tiny-F16")
    with werk_serve(home, ids) as served, served.client() as client:
        for model_id in ("tiny-latest", "Tiny-GGUF-tiny-F16"):
            chat = {"model": model_id, "messages": [{"role": "user", "content": "hi"}]}
            answer = client.post("/v1/chat/completions", json={**chat, "max_tokens": 4})
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model_id
            assert answer.json()["usage"]["completion_tokens"] > 0


def test_a_model_directory_in_the_hf_cache_is_imported_through_its_links(
    tmp_path: Path, stores: dict[str, str]
) -> None:
    header = json.dumps({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]}})
    weights = len(header).to_bytes(8, "little") + header.encode() + b"\0" * 8
    config = json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 64})
    files = {"config.json": config.encode(), "model.safetensors": weights}
    hf_cache(Path(stores["HF_HUB_CACHE"]), "acme/tiny-hf", files)
    home = tmp_path / "home"
    args = ("models", "import", "--from", "hf-cache", "acme/tiny-hf", "--backend", "vllm")
    done = werk(home, stores, *args, "--json")
    assert done.returncode == 0, done.stderr
    manifest = json.loads(done.stdout)
    assert manifest["id"] == "tiny-hf"
    assert sorted(Path(f["path"]).name for f in manifest["files"]) == sorted(files)
    shown = json.loads(werk(home, stores, "models", "show", "tiny-hf", "--json").stdout)
    assert shown["facts"]["architecture"] == "LlamaForCausalLM"
    assert (shown["facts"]["context_length"], shown["facts"]["parameters"]) == (64, 4)
