"""Models other tools already downloaded: Ollama's store, the Hugging Face cache, LM Studio's
models folder. Each is read where it lies; importing one references its files in place.

* **Ollama** (``OLLAMA_MODELS``, default ``~/.ollama/models``): a manifest per model under
  ``manifests/<registry>/<namespace>/<model>/<tag>`` (JSON with ``layers``); the layer of media
  type ``application/vnd.ollama.image.model`` is the GGUF, stored at ``blobs/sha256-<hex>``
  (ollama/ollama ``server/modelpath.go``: ``GetBlobsPath`` accepts only
  ``^sha256[:-][0-9a-fA-F]{64}$`` and replaces ``:`` by ``-``). A model of the default registry
  and namespace (``registry.ollama.ai/library``) is named ``model:tag`` as ``ollama list``
  names it; another is ``registry/namespace/model:tag``.
* **Hugging Face cache** (``HF_HUB_CACHE``, default ``~/.cache/huggingface/hub``), read by
  ``huggingface_hub.scan_cache_dir``: a repository's latest revision; each ``.gguf`` file in it
  is one model ``owner/repo:FILE``; a repository with ``config.json`` or ``model_index.json`` is
  one model ``owner/repo`` (the snapshot folder).
* **LM Studio** (``~/.lmstudio/models``, or the older ``~/.cache/lm-studio/models``):
  ``<publisher>/<repo>/<file>.gguf``, named ``publisher/repo/file.gguf``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from .protocol import InvalidRequest, NotFound

__all__ = [
    "STORES",
    "StoreModel",
    "cached_model_revisions",
    "find_in_store",
    "hub_client",
    "store_models",
]

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_PREFIX = ("registry.ollama.ai", "library")
_OLLAMA_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
_MAX_MANIFEST = 1024 * 1024


class StoreModel(msgspec.Struct, frozen=True, kw_only=True):
    """One model found in a local store.

    :ivar store: ``ollama``, ``hf-cache`` or ``lmstudio``.
    :ivar name: how to name it to ``werk models import --from STORE NAME``.
    :ivar format: ``gguf``, or ``hf``/``diffusers`` for a model directory.
    :ivar paths: what to import: one file, or one directory.
    :ivar size: bytes on disk.
    """

    store: str
    name: str
    format: str
    paths: tuple[str, ...]
    size: int


def _ollama_root() -> Path:
    return Path(os.environ.get("OLLAMA_MODELS") or Path.home() / ".ollama" / "models")


def ollama_models(root: Path | None = None) -> list[StoreModel]:
    """Every model with a GGUF layer in Ollama's store (others are skipped)."""
    root = root or _ollama_root()
    manifests = root / "manifests"
    found = []
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = manifest.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        try:
            if manifest.stat().st_size > _MAX_MANIFEST:
                continue
            layers = json.loads(manifest.read_bytes()).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        model = [
            layer
            for layer in layers
            if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER
        ]
        digest = _OLLAMA_DIGEST.match(str(model[0].get("digest", ""))) if len(model) == 1 else None
        if digest is None:
            continue
        blob = root / "blobs" / f"sha256-{digest.group(1)}"
        if not blob.is_file():
            continue
        host, namespace, name, tag = parts
        prefix = "" if (host, namespace) == OLLAMA_DEFAULT_PREFIX else f"{host}/{namespace}/"
        found.append(
            StoreModel(
                store="ollama",
                name=f"{prefix}{name}:{tag}",
                format="gguf",
                paths=(str(blob),),
                size=blob.stat().st_size,
            )
        )
    return found


def hub_client() -> Any:
    """The ``huggingface_hub`` module.

    :raises werk.InvalidRequest: it is not installed (the ``hub`` extra)."""
    try:
        import huggingface_hub
    except ImportError:
        raise InvalidRequest(
            "the Hugging Face Hub and cache need huggingface_hub: pip install 'werk[hub]'"
        ) from None
    return huggingface_hub


def cached_model_revisions(cache_dir: Path | None = None) -> dict[str, Any]:
    """The latest cached revision (``huggingface_hub.CachedRevisionInfo``) of every model
    repository in the Hugging Face cache, by repository id; empty when there is no cache."""
    from huggingface_hub.errors import CacheNotFound

    try:
        repos = hub_client().scan_cache_dir(cache_dir).repos
    except CacheNotFound:
        return {}
    return {
        repo.repo_id: max(repo.revisions, key=lambda r: r.last_modified)
        for repo in sorted(repos, key=lambda r: r.repo_id)
        if repo.repo_type == "model" and repo.revisions
    }


def hf_cache_models(cache_dir: Path | None = None) -> list[StoreModel]:
    """Every GGUF file and model directory in the Hugging Face cache (latest revision of each
    model repository)."""
    found = []
    for repo_id, revision in cached_model_revisions(cache_dir).items():
        files = {f.file_name: f for f in revision.files}
        snapshot = Path(revision.snapshot_path)
        for name, cached in sorted(files.items()):
            if name.lower().endswith(".gguf"):
                found.append(
                    StoreModel(
                        store="hf-cache",
                        name=f"{repo_id}:{Path(name).name}",
                        format="gguf",
                        paths=(str(cached.file_path),),
                        size=cached.size_on_disk,
                    )
                )
        marker = next((m for m in ("model_index.json", "config.json") if m in files), None)
        if marker is not None:
            found.append(
                StoreModel(
                    store="hf-cache",
                    name=repo_id,
                    format="diffusers" if marker == "model_index.json" else "hf",
                    paths=(str(snapshot),),
                    size=revision.size_on_disk,
                )
            )
    return found


def _lmstudio_roots() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def lmstudio_models(roots: list[Path] | None = None) -> list[StoreModel]:
    """Every ``publisher/repo/file.gguf`` in LM Studio's models folders."""
    found = []
    for root in roots or _lmstudio_roots():
        for path in sorted(root.glob("*/*/*.gguf")):
            if path.is_file():
                found.append(
                    StoreModel(
                        store="lmstudio",
                        name=str(path.relative_to(root)),
                        format="gguf",
                        paths=(str(path),),
                        size=path.stat().st_size,
                    )
                )
    return found


STORES: dict[str, Callable[[], list[StoreModel]]] = {
    "ollama": ollama_models,
    "hf-cache": hf_cache_models,
    "lmstudio": lmstudio_models,
}


def store_models(store: str | None = None) -> list[StoreModel]:
    """What ``store`` (every store when ``None``) holds.

    :raises werk.InvalidRequest: an unknown store name.
    """
    if store is not None and store not in STORES:
        raise InvalidRequest(f"unknown store {store!r}; stores: {', '.join(STORES)}")
    return [m for name, read in STORES.items() if store in (None, name) for m in read()]


def find_in_store(store: str, name: str) -> StoreModel:
    """The model ``name`` in ``store`` (Ollama's ``model`` means ``model:latest``).

    :raises werk.NotFound: no such model there (the message lists what there is).
    """
    models = store_models(store)
    wanted = name if store != "ollama" or ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
    for model in models:
        if model.name == wanted:
            return model
    listed = ", ".join(m.name for m in models[:20]) or "nothing"
    raise NotFound(f"{store} has no model {name!r} (it has: {listed})")
