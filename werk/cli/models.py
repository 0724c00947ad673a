"""``werk models``: the local model registry (manifests under WERK_HOME/models)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..protocol import InvalidRequest
from ._app import app
from ._output import emit_json, print_table, reporting_errors

if TYPE_CHECKING:
    from ..demos import DemoModel
    from ..plugins import WerkPluginManager

models_app = typer.Typer(
    help="Import, list and remove models. A model is a manifest of files with SHA-256 digests; "
    "its identity changes whenever its files do.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")

JSON_HELP = "Print JSON instead of a table."
ENDPOINT_FORMAT = "openai-endpoint"
"""A backend with this format serves a separately operated endpoint: its models have no files."""


def _formats_of(paths: list[Path]) -> set[str]:
    """The formats the paths name: a file's suffix (``gguf``); a Diffusers pipeline directory
    (``model_index.json``) is ``diffusers``; another directory with a ``config.json`` is a
    Hugging Face model (``hf`` or ``transformers``: more than one backend may serve it)."""
    formats: set[str] = set()
    for path in paths:
        if not path.is_dir():
            formats.add(path.suffix.lower().lstrip("."))
        elif (path / "model_index.json").is_file():
            formats.add("diffusers")
        elif (path / "config.json").is_file():
            formats.add("hf")
        else:
            raise InvalidRequest(
                f"{path} is a directory without model_index.json or config.json: not a model"
            )
    return formats


def _backend_for(paths: list[Path], backend: str | None) -> str:
    from ..plugins import get_plugin_manager

    pm = get_plugin_manager()
    if backend is not None:
        if backend not in pm.backends:
            known = ", ".join(sorted(pm.backends)) or "none"
            raise InvalidRequest(f"no loaded plugin provides backend {backend!r} (loaded: {known})")
        return backend
    suffixes = _formats_of(paths)
    if suffixes == {"hf"}:  # a Transformers directory: vLLM (LLMs) and media both take them
        served = {"hf", "transformers"}
        candidates = sorted(n for n, d in pm.backends.items() if served & set(d.formats))
        if len(candidates) > 1:
            raise InvalidRequest(
                "a Hugging Face model directory can be served by "
                f"{', '.join(candidates)}; pass --backend"
            )
        suffixes = {"hf", "transformers"} & {f for c in candidates for f in pm.backends[c].formats}
    matches = sorted(
        name for name, d in pm.backends.items() if suffixes and suffixes <= set(d.formats)
    )
    if len(matches) != 1:
        raise InvalidRequest(
            "cannot infer the backend from the file type; pass --backend "
            f"({', '.join(sorted(pm.backends)) or 'no backends loaded'})"
        )
    return matches[0]


def _expand(paths: list[Path]) -> list[Path]:
    """Files as given; a directory becomes every regular file under it (hidden ones and
    symbolic links skipped), in sorted order, so its identity covers every weight and config."""
    files: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        found = [
            p
            for p in sorted(path.rglob("*"))
            if p.is_file()
            and not p.is_symlink()
            and not any(part.startswith(".") for part in p.relative_to(path).parts)
        ]
        if not found:
            raise InvalidRequest(f"{path} holds no files")
        files.extend(found)
    return files


@models_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List imported models."""
    from ..config import werk_home
    from ..models import ModelRegistry

    manifests = ModelRegistry(werk_home()).manifests()
    if as_json:
        emit_json({"models": manifests})
        return
    if not manifests:
        typer.echo("No models imported. Try `werk models import PATH --id ID`.")
        return
    print_table(
        "Models",
        ["ID", "BACKEND", "SIZE", "IDENTITY", "FILES"],
        [
            (
                m.id,
                m.backend,
                f"{sum(f.size for f in m.files) / 2**20:.1f} MiB",
                m.identity[:19] + "…",
                ", ".join(Path(f.path).name for f in m.files),
            )
            for m in manifests
        ],
    )


def _options(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as model options (VALUE as JSON where it parses)."""
    import json

    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidRequest(f"--option {pair!r} must be KEY=VALUE")
        try:
            options[key.strip()] = json.loads(raw)
        except ValueError:
            options[key.strip()] = raw
    return options


@models_app.command("import")
def import_model(
    paths: list[Path] = typer.Argument(
        None,
        help="Model file(s) or a model directory (Diffusers, Transformers); none for an "
        "endpoint backend.",
    ),
    model_id: str = typer.Option(..., "--id", help="The id clients will use (e.g. 'demo')."),
    backend: str | None = typer.Option(None, help="Backend name; inferred from the file type."),
    option: list[str] = typer.Option(
        [],
        "--option",
        metavar="KEY=VALUE",
        help="A backend option of this model (repeatable); VALUE is JSON where it parses "
        '(`ctx_size=8192`, `embeddings=true`, `native_args=["--flash-attn","on"]`), '
        "else a string. The backend checks them when the model starts.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Record a manifest for PATH under --id (files are referenced in place, not copied).

    Re-importing under the same id replaces the manifest; changed files give a new identity,
    so a running server starts a new backend process for them. A backend that serves a
    separately operated endpoint takes no files: `werk models import --backend vllm-remote
    --id remote` (the endpoint comes from that backend's environment variables). Backend
    options (llama.cpp: ctx_size, parallel, state_slots, embeddings, native_args, …) are set
    with --option.
    """
    from ..config import werk_home
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager

    paths = paths or []
    with reporting_errors(as_json):
        chosen = _backend_for(paths, backend)
        endpoint = ENDPOINT_FORMAT in get_plugin_manager().backends[chosen].formats
        if not paths and not endpoint:
            raise InvalidRequest(f"backend {chosen!r} needs model files: give PATH")
        if paths and endpoint:
            raise InvalidRequest(f"backend {chosen!r} serves an endpoint: it takes no files")
        manifest = ModelRegistry(werk_home()).import_files(
            _expand(paths),
            model_id=model_id,
            backend=chosen,
            endpoint=endpoint,
            options=_options(option),
        )
    if as_json:
        emit_json(manifest)
    else:
        typer.echo(f"imported {manifest.id} ({manifest.backend}) identity {manifest.identity}")


@models_app.command("remove")
def remove_model(
    model_id: str = typer.Argument(..., help="The model id."),
    execute: bool = typer.Option(False, "--execute", help="Actually remove (default: preview)."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Remove a model's manifest (never its files). Previews unless --execute."""
    from ..config import werk_home
    from ..models import ModelRegistry

    with reporting_errors(as_json):
        registry = ModelRegistry(werk_home())
        manifest = registry.remove(model_id) if execute else registry.get(model_id)
    if as_json:
        emit_json({"executed": execute, "model": manifest})
    elif execute:
        typer.echo(f"removed manifest of {manifest.id}; files left in place")
    else:
        typer.echo(f"would remove manifest of {manifest.id}; run again with --execute")


def demo_models(pm: WerkPluginManager) -> dict[str, tuple[str, DemoModel]]:
    """Every plugin's demo kinds, with the plugin offering each.

    :raises werk.InvalidRequest: two plugins offer the same kind.
    """
    from ..demos import DemoModel

    return pm.offers("werk_demo_models", DemoModel, lambda demo: demo.kind, "demo kind")


@models_app.command("create-demo")
def create_demo(
    kind: str = typer.Option(
        "gguf", "--kind", metavar="KIND", help="Which demo (unknown kinds list the installed ones)."
    ),
    model_id: str = typer.Option("demo", "--id", metavar="ID", help="Model id to import it as."),
    seed: int = typer.Option(0, "--seed", min=0, help="Weights seed (same seed, same files)."),
    size: str = typer.Option(
        "tiny", "--size", metavar="SIZE", help="tiny, or a size the kind offers."
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        metavar="PATH",
        help="Where to write it (default: WERK_HOME/models/files).",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Generate a small random-weight model locally and import it (no download). Kinds come
    from the installed plugins: `gguf` (llama.cpp) with werk-llamacpp. Idempotent: the same seed
    gives the same files, hence the same identity."""
    from ..config import werk_home
    from ..demos import DemoRequest
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager

    with reporting_errors(as_json):
        demos = demo_models(get_plugin_manager())
        if kind not in demos:
            offered = "; ".join(
                f"{k} ({d.backend}: {d.description})" for k, (_, d) in sorted(demos.items())
            )
            raise InvalidRequest(
                f"no installed plugin offers demo kind {kind!r}; kinds: {offered or 'none'}"
            )
        demo = demos[kind][1]
        home = werk_home()
        files = demo.create(
            DemoRequest(
                model_id=model_id,
                home=home,
                output=output,
                seed=seed,
                size=size,
                progress=lambda line: typer.echo(line, err=True),
            )
        )
        manifest = ModelRegistry(home).import_files(
            list(files), model_id=model_id, backend=demo.backend, options=dict(demo.options)
        )
    if as_json:
        emit_json(manifest)
    else:
        typer.echo(f"imported {manifest.id} ({manifest.backend}) identity {manifest.identity}")
