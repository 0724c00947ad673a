"""The ``gguf`` demo model of ``werk models create-demo`` (the host command imports it).

The file is fully determined by ``(seed, size)`` (see :mod:`werk_llamacpp.demo`), so running the
command twice gives the same bytes and therefore the same model identity. A sidecar
``<file>.demo.json`` records what was generated; when it matches the request and the file is
unchanged (size and mtime), the file is not generated again (the medium model is ~1.9 GB).

The host's ``werk models create-demo --kind gguf`` (the default kind) calls :func:`create_demo`
through the ``werk_demo_models`` hook and imports the file for the ``llamacpp`` backend.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from werk import DemoModel, DemoRequest, InvalidRequest, werk_home

__all__ = ["DEMO", "create_demo", "default_output", "ensure_demo_file"]

SIDECAR_SCHEMA = 1


def default_output(model_id: str, home: Path | None = None) -> Path:
    return (home or werk_home()) / "models" / "files" / f"{model_id}.gguf"


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".demo.json")


def _sidecar_matches(path: Path, seed: int, size: str) -> bool:
    try:
        recorded = json.loads(_sidecar(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return bool(
        isinstance(recorded, dict)
        and recorded.get("schema") == SIDECAR_SCHEMA
        and recorded.get("seed") == seed
        and recorded.get("size") == size
        and recorded.get("n_bytes") == st.st_size
        and recorded.get("mtime_ns") == st.st_mtime_ns
    )


def ensure_demo_file(path: Path, *, seed: int, size: str) -> tuple[Path, bool]:
    """Write the demo GGUF at ``path`` unless an identical one is already there.

    :returns: the absolute path and whether it was (re)generated.
    """
    from .demo import create_demo_model

    path = path.expanduser().absolute()
    if _sidecar_matches(path, seed, size):
        return path, False
    if path.exists() and not _sidecar(path).exists():
        raise InvalidRequest(
            f"{path} exists and was not written by create-demo; remove it or pass --output"
        )
    if path.parent == default_output("x").parent:
        path.parent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # WERK_HOME/models
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = create_demo_model(path, seed=seed, size=size)  # type: ignore[arg-type]
    st = path.stat()
    record = {
        "schema": SIDECAR_SCHEMA,
        "seed": seed,
        "size": size,
        "sha256": info.sha256,
        "n_bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
    }
    tmp = _sidecar(path).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, _sidecar(path))
    return path, True


SIZES = ("tiny", "medium", "moe")


def create_demo(request: DemoRequest) -> list[Path]:
    """``DemoModel.create`` of kind ``gguf``: the demo GGUF for ``request`` (kept when an
    identical one is already there)."""
    if request.size not in SIZES:
        raise InvalidRequest(
            "--size must be 'tiny' (~1 MB), 'medium' (~0.35 B params, ~0.7 GB) or 'moe' "
            "(8 experts, ~27 MB)"
        )
    path, generated = ensure_demo_file(
        request.output or default_output(request.model_id, request.home),
        seed=request.seed,
        size=request.size,
    )
    request.progress(
        f"{'wrote' if generated else 'kept'} {path} ({request.size}, seed {request.seed})"
    )
    return [path]


DEMO = DemoModel(
    kind="gguf",
    backend="llamacpp",
    description=(
        "random-weight LLaMA GGUF, byte-level tokenizer (tiny ~1 MB, medium ~0.7 GB, "
        "moe: 8 experts ~27 MB)"
    ),
    create=create_demo,
)
