"""``werk models create-demo``: generate the demo GGUF and import it as a model.

The file is fully determined by ``(seed, size)`` (see :mod:`werk_llamacpp.demo`), so running the
command twice gives the same bytes and therefore the same model identity. A sidecar
``<file>.demo.json`` records what was generated; when it matches the request and the file is
unchanged (size and mtime), the file is not generated again (the medium model is ~1.9 GB).

The import uses the host's public model registry (:class:`werk.ModelRegistry`), exactly as
``werk models import`` does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from werk import InvalidRequest, ModelRegistry, werk_home

__all__ = ["default_output", "ensure_demo_file", "register_commands"]

SIDECAR_SCHEMA = 1


def default_output(model_id: str) -> Path:
    return werk_home() / "models" / "files" / f"{model_id}.gguf"


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


def register_commands(models: typer.Typer) -> None:
    """Add ``create-demo`` to the ``werk models`` group."""

    @models.command("create-demo")
    def create_demo(
        model_id: str = typer.Option("demo", "--id", help="Model id to import it as."),
        seed: int = typer.Option(0, "--seed", min=0, help="Weights seed (same seed, same file)."),
        size: str = typer.Option(
            "tiny", "--size", help="tiny (~1 MB) or medium (~1 B params, ~1.9 GB)."
        ),
        output: Path | None = typer.Option(
            None, "--output", help="Where to write the GGUF (default: WERK_HOME/models/files)."
        ),
    ) -> None:
        """Generate a random-weight LLaMA GGUF (byte-level tokenizer, ChatML template) and
        import it for the llama.cpp backend. Idempotent: the same seed gives the same identity."""
        if size not in ("tiny", "medium"):
            raise typer.BadParameter("must be 'tiny' or 'medium'", param_hint="--size")
        try:
            path, generated = ensure_demo_file(
                output or default_output(model_id), seed=seed, size=size
            )
        except InvalidRequest as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"{'wrote' if generated else 'kept'} {path} ({size}, seed {seed})", err=True)
        try:
            manifest = ModelRegistry(werk_home()).import_files(
                [path], model_id=model_id, backend="llamacpp"
            )
        except InvalidRequest as exc:
            typer.echo(f"error: {exc.message}", err=True)
            raise typer.Exit(1) from None
        identity = manifest.identity
        typer.echo(f"imported {model_id} (llamacpp) identity {identity}")
