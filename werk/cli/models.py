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
    from ..models import ModelManifest
    from ..plugins import WerkPluginManager

models_app = typer.Typer(
    help="Pull, import, inspect, list and remove models. A model is a manifest of files with "
    "SHA-256 digests; its identity changes whenever its files do.",
    no_args_is_help=True,
)
app.add_typer(models_app, name="models")

JSON_HELP = "Print JSON instead of a table."
ENDPOINT_FORMAT = "openai-endpoint"
"""A backend with this format serves a separately operated endpoint: its models have no files."""


def _backend_for(paths: list[Path], backend: str | None, formats: set[str] | None = None) -> str:
    from ..plugins import get_plugin_manager

    pm = get_plugin_manager()
    if backend is not None:
        if backend not in pm.backends:
            known = ", ".join(sorted(pm.backends)) or "none"
            raise InvalidRequest(f"no loaded plugin provides backend {backend!r} (loaded: {known})")
        return backend
    from ..model_formats import formats_of

    suffixes = formats if formats is not None else formats_of(paths)
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


def _expand(paths: list[Path], *, follow_links: bool = False) -> list[Path]:
    """Files as given; a directory becomes every regular file under it (hidden ones and
    symbolic links skipped, unless ``follow_links``: a Hugging Face cache snapshot is made of
    links), in sorted order, so its identity covers every weight and config."""
    files: list[Path] = []
    for path in paths:
        if not path.is_dir():
            files.append(path)
            continue
        found = [
            p
            for p in sorted(path.rglob("*"))
            if p.is_file()
            and (follow_links or not p.is_symlink())
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


def _from_store(
    store: str, names: list[Path], model_id: str | None
) -> tuple[list[Path], set[str], str]:
    """The paths, format and id of the model a store holds under ``names[0]``."""
    from ..model_stores import find_in_store

    if len(names) != 1:
        raise InvalidRequest(f"--from {store} takes one model name (see `werk models discover`)")
    found = find_in_store(store, str(names[0]))
    if model_id is None:
        model_id = _as_id(found.name.split("/")[-1].removesuffix(".gguf"))
    return [Path(p) for p in found.paths], {found.format}, model_id


def _as_id(name: str) -> str:
    """A store's or repository's name made into a model id (``llama3.2:1b`` → ``llama3.2-1b``).

    :raises werk.InvalidRequest: nothing usable is left."""
    import re

    from ..models import validate_model_id

    return validate_model_id(re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-."))


@models_app.command("discover")
def discover_models(
    store: str | None = typer.Option(
        None, "--from", metavar="STORE", help="Only this store: ollama, hf-cache or lmstudio."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List models other tools already downloaded (Ollama's store, the Hugging Face cache,
    LM Studio's models folder), ready for `werk models import --from STORE NAME`."""
    from ..model_stores import store_models

    with reporting_errors(as_json):
        found = store_models(store)
    if as_json:
        emit_json({"models": found})
        return
    if not found:
        typer.echo("No models found in the Ollama store, the Hugging Face cache or LM Studio.")
        return
    print_table(
        "Models in local stores",
        ["STORE", "NAME", "FORMAT", "SIZE"],
        [(m.store, m.name, m.format, _mib(m.size)) for m in found],
    )
    typer.echo("Import one: werk models import --from STORE NAME [--id ID]")


@models_app.command("import")
def import_model(
    paths: list[Path] = typer.Argument(
        None,
        help="Model file(s) or a model directory (Diffusers, Transformers); none for an "
        "endpoint backend.",
    ),
    model_id: str | None = typer.Option(
        None,
        "--id",
        help="The id clients will use (e.g. 'demo'); with --from, defaults to the model's name "
        "in the store made into an id ('llama3.2:1b' -> 'llama3.2-1b').",
    ),
    backend: str | None = typer.Option(None, help="Backend name; inferred from the file type."),
    store: str | None = typer.Option(
        None,
        "--from",
        metavar="STORE",
        help="Import a model another tool downloaded: ollama, hf-cache or lmstudio; PATH is "
        "then its name there (`werk models discover` lists them).",
    ),
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

    The files are checked first: a GGUF's header and tensor directory, a Diffusers
    pipeline's model_index.json and components, a Transformers config.json and its weights.
    Files the backend cannot load are refused with the reason, and nothing is recorded.

    Re-importing under the same id replaces the manifest; changed files give a new identity,
    so a running server starts a new backend process for them. A backend that serves a
    separately operated endpoint takes no files: `werk models import --backend vllm-remote
    --id remote` (the endpoint comes from that backend's environment variables). Backend
    options (llama.cpp: ctx_size, parallel, state_slots, embeddings, native_args, …) are set
    with --option.
    """

    paths = paths or []
    if model_id is None and store is None:
        raise typer.BadParameter(
            "give the model an id (only --from can derive one)", param_hint="'--id'"
        )
    with reporting_errors(as_json):
        formats = None
        if store is not None:
            paths, formats, model_id = _from_store(store, paths, model_id)
        assert model_id is not None
        manifest = _record(
            paths, model_id, backend, formats, _options(option), follow_links=store is not None
        )
    _report_import(manifest, as_json)


def _record(
    paths: list[Path],
    model_id: str,
    backend: str | None,
    formats: set[str] | None,
    options: dict[str, Any],
    *,
    follow_links: bool,
) -> ModelManifest:
    """Check and record ``paths`` under ``model_id`` (import, import --from and pull)."""
    from ..config import werk_home
    from ..model_formats import directory_facts, inspect_model
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager

    chosen = _backend_for(paths, backend, formats)
    descriptor = get_plugin_manager().backends[chosen]
    endpoint = ENDPOINT_FORMAT in descriptor.formats
    if not paths and not endpoint:
        raise InvalidRequest(f"backend {chosen!r} needs model files: give PATH")
    if paths and endpoint:
        raise InvalidRequest(f"backend {chosen!r} serves an endpoint: it takes no files")
    for path in paths:
        if path.is_dir():  # refused here, before any weight is hashed
            directory_facts(path)
    return ModelRegistry(werk_home()).import_files(
        _expand(paths, follow_links=follow_links),
        model_id=model_id,
        backend=chosen,
        endpoint=endpoint,
        options=options,
        inspect=lambda spec: inspect_model(spec, descriptor),
    )


def _report_import(manifest: ModelManifest, as_json: bool) -> None:
    if as_json:
        emit_json(manifest)
    else:
        typer.echo(f"imported {manifest.id} ({manifest.backend}) identity {manifest.identity}")


@models_app.command("pull")
def pull_model(
    source: str = typer.Argument(
        ...,
        metavar="hf:OWNER/REPO[:FILE_OR_QUANT]",
        help="A Hugging Face repository; for a GGUF repository, the file or quantisation to "
        "take (hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M).",
    ),
    model_id: str | None = typer.Option(
        None, "--id", help="The id clients will use (default: the file or repository name)."
    ),
    backend: str | None = typer.Option(None, help="Backend name; inferred from the files."),
    revision: str | None = typer.Option(None, help="A branch, tag or commit (default: main)."),
    option: list[str] = typer.Option(
        [], "--option", metavar="KEY=VALUE", help="A backend option of this model (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Download a model from the Hugging Face Hub into its cache and import it.

    Uses huggingface_hub (HF_TOKEN for gated repositories, HF_ENDPOINT for a mirror,
    HF_HUB_OFFLINE=1 to use only what is cached). An interrupted download leaves no model and
    resumes when you pull again."""
    from ..model_pull import pull

    with reporting_errors(as_json):
        pulled = pull(source, revision=revision)
        manifest = _record(
            [Path(p) for p in pulled.paths],
            model_id or _as_id(pulled.suggested_id),
            backend,
            {pulled.format},
            _options(option),
            follow_links=True,
        )
    _report_import(manifest, as_json)


def _count(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value >= size:
            return f"{value / size:.2f}{unit}"
    return str(value)


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value:,} tokens"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


@models_app.command("show")
def show_model(
    model_id: str = typer.Argument(..., help="The model id."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """What Werk reads from a model's files without loading it: architecture, parameters,
    quantisation, context length, chat template, experts, and the estimated memory of one
    runtime at the model's options (weights + KV cache + compute) against what this machine
    has available now."""
    import psutil

    from ..config import werk_home
    from ..model_formats import inspect_model
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager
    from ..protocol.residency import ExpertTier

    with reporting_errors(as_json):
        registry = ModelRegistry(werk_home())
        manifest = registry.get(model_id)
        registry.verify_unchanged(manifest)
        backends = get_plugin_manager().backends
        if manifest.backend not in backends:
            raise InvalidRequest(
                f"model {model_id!r} is served by backend {manifest.backend!r}, "
                "which no loaded plugin provides"
            )
        facts = inspect_model(manifest.spec(), backends[manifest.backend])
    available = psutil.virtual_memory().available
    need = facts.memory if facts is not None else None
    fits = None if need is None or need.tier != ExpertTier.RAM else need.nbytes <= available
    if as_json:
        emit_json(
            {
                "model": manifest,
                "facts": facts,
                "memory": {"available_bytes": available, "fits": fits},
            }
        )
        return
    size = sum(f.size for f in manifest.files)
    rows: list[tuple[str, str]] = [
        ("id", manifest.id),
        ("backend", manifest.backend),
        ("identity", manifest.identity),
        ("files", f"{len(manifest.files)} ({_mib(size)})"),
    ]
    if facts is None:
        rows.append(("facts", f"backend {manifest.backend!r} reads none from its files"))
    else:
        rows += [
            ("format", facts.format),
            ("architecture", facts.architecture or "-"),
            ("parameters", _count(facts.parameters)),
            ("quantisation", facts.quantization or "-"),
            ("context length", _tokens(facts.context_length)),
            (
                "chat template",
                "-" if facts.chat_template is None else "yes" if facts.chat_template else "no",
            ),
            (
                "experts",
                "not a mixture of experts"
                if facts.experts is None
                else f"{facts.experts} ({facts.experts_used or '?'} per token)",
            ),
        ]
    if need is None:
        rows.append(("memory", "no estimate from this backend"))
    else:
        parts = " + ".join(f"{name} {_mib(n)}" for name, n in need.parts)
        rows.append(
            ("memory", f"{_mib(need.nbytes)} {need.tier}" + (f" ({parts})" if parts else ""))
        )
        if facts is not None and facts.memory_basis:
            rows.append(("assumes", facts.memory_basis))
        verdict = "fits" if fits else "does not fit"
        if fits is not None:
            rows.append(("this machine", f"{verdict}: {_mib(available)} RAM available now"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        typer.echo(f"{key:<{width}}  {value}")


@models_app.command("remove")
def remove_model(
    model_id: str = typer.Argument(..., help="The model id."),
    execute: bool = typer.Option(False, "--execute", help="Actually remove (default: preview)."),
    delete_files: bool = typer.Option(
        False,
        "--delete-files",
        help="Also delete the files Werk wrote itself (generated demos under "
        "WERK_HOME/models/files) that no other model uses. Files imported from elsewhere "
        "are never deleted.",
    ),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Remove a model's manifest; with --delete-files also the files Werk wrote for it.
    Previews (listing what would be deleted and what is kept) unless --execute."""
    from ..config import werk_home
    from ..models import ModelRegistry

    with reporting_errors(as_json):
        registry = ModelRegistry(werk_home())
        manifest = registry.get(model_id)
        if delete_files:
            delete, keep = registry.owned_files(manifest)
        else:
            delete, keep = [], [Path(f.path) for f in manifest.files]
        if execute:
            registry.remove(model_id)  # the manifest first: no model ever names a deleted file
            registry.delete_files(delete)
    if as_json:
        emit_json(
            {
                "executed": execute,
                "model": manifest,
                "deleted_files" if execute else "would_delete_files": [str(p) for p in delete],
                "kept_files": [str(p) for p in keep],
            }
        )
        return
    size = sum(f.size for f in manifest.files if Path(f.path) in delete)
    if execute:
        typer.echo(f"removed manifest of {manifest.id}")
        if delete:
            typer.echo(f"deleted {len(delete)} file(s), {_mib(size)}")
    else:
        typer.echo(f"would remove manifest of {manifest.id}")
        for path in delete:
            typer.echo(f"  would delete {path}")
    if keep:
        typer.echo(f"{'kept' if execute else 'would keep'} {len(keep)} file(s) in place")
        if delete_files:
            for path in keep:
                typer.echo(f"  keep {path} (not written by Werk, or used by another model)")
    if not execute:
        typer.echo("run again with --execute")


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
