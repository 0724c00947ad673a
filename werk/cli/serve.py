"""``werk serve``: the HTTP server for /v1 and /werk/v1."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from ..protocol import (
    TTL_MAX_SECONDS,
    TTL_MIN_SECONDS,
    AuthMode,
    PersistenceDefaults,
    Retention,
    Reuse,
    WerkError,
)
from ..protocol.residency import parse_keep_alive
from . import _gc
from ._app import app

if TYPE_CHECKING:
    import uvicorn

    from ..control.service import LocalControlService

API_KEYS_ENV = "WERK_API_KEYS"
HEADER_TIMEOUT_DEFAULT = 10.0  # werk.http.server.HEADER_TIMEOUT_SECONDS (not imported: lazy)
GRACEFUL_SHUTDOWN_SECONDS = 10.0  # werk.http.exchange.GRACEFUL_SHUTDOWN_SECONDS (the same)
STARTUP_SWITCH_INTERVAL = 0.0005
"""The interpreter's thread switch interval (``sys.setswitchinterval``; default 5 ms) while the
HTTP stack is imported in a worker thread: the preload on the event loop (readiness polls,
``/props``) gets the interpreter back within half a millisecond instead of five each time it
wakes up."""

GC_RESUME_SECONDS = 2.0
"""The longest the garbage collector stays paused after the HTTP stack is up while a preload is
still loading (requests may already be served meanwhile)."""

HEADER_TIMEOUT_MIN = 1.0
HEADER_TIMEOUT_MAX = 600.0


class EventLoop(StrEnum):
    """``werk serve --loop``: the event loop the server runs on."""

    AUTO = "auto"
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def event_loop_options(choice: EventLoop) -> dict[str, bool]:
    """anyio's ``backend_options`` for ``choice``. ``auto`` is uvloop (libuv's loop) where it is
    installed (Werk depends on it except on Windows) and Python's own loop otherwise: on uvloop a
    relayed ``/v1`` chat costs ``werk serve`` 4-7 % less CPU, a streamed one 12-18 % less
    (``benchmarks/proxy_cpu_ab.py``, docs/performance.md).

    :raises typer.BadParameter: ``uvloop`` was asked for and is not installed.
    """
    if choice is EventLoop.ASYNCIO:
        return {"use_uvloop": False}
    installed = importlib.util.find_spec("uvloop") is not None
    if choice is EventLoop.UVLOOP and not installed:
        raise typer.BadParameter(
            "uvloop is not installed (pip install uvloop), or use --loop asyncio",
            param_hint="--loop",
        )
    return {"use_uvloop": installed}


def persistence_defaults(
    *,
    persistence: bool,
    mode: Retention | None,
    reuse: Reuse | None,
    ttl_seconds: int | None,
    pin: bool,
) -> PersistenceDefaults | None:
    """The server's Prefill defaults. Any granular flag implies ``--persistence``; alone it
    means auto retention, prefer reuse, no TTL, no pin, and the experimental opt-in."""
    granular = mode is not None or reuse is not None or ttl_seconds is not None or pin
    if not (persistence or granular):
        return None
    if ttl_seconds is not None and not TTL_MIN_SECONDS <= ttl_seconds <= TTL_MAX_SECONDS:
        raise typer.BadParameter(
            f"must be between {TTL_MIN_SECONDS} and {TTL_MAX_SECONDS}",
            param_hint="--persistence-ttl-seconds",
        )
    return PersistenceDefaults(
        retention=mode or Retention.AUTO,
        reuse=reuse or Reuse.PREFER,
        ttl_seconds=ttl_seconds,
        pin=pin,
        allow_experimental=True,
    )


def collect_api_keys(keys: list[str], key_file: Path | None) -> list[str]:
    collected = [k.strip() for k in keys if k.strip()]
    if key_file is not None:
        try:
            text = key_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise typer.BadParameter(f"cannot read {key_file}: {exc.strerror}") from None
        collected += [
            line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
        ]
    collected += [k.strip() for k in os.environ.get(API_KEYS_ENV, "").split(",") if k.strip()]
    return collected


@app.command()
def serve(
    model: list[str] = typer.Option(
        [],
        "--model",
        metavar="ID",
        help="Serve only this imported model id (repeatable), started with the server. "
        "Without --model every imported model is served, each loaded on its first request "
        "(also one imported while the server runs). See `werk models list`.",
    ),
    host: str = typer.Option(
        "127.0.0.1", metavar="HOST", help="Bind address. Non-loopback requires an API key."
    ),
    port: int = typer.Option(
        11434, min=0, max=65535, metavar="PORT", help="TCP port (0 picks a free one)."
    ),
    api_key: list[str] = typer.Option(
        [],
        "--api-key",
        metavar="KEY",
        help=f"Accept this API key (repeatable). Also: --api-key-file, {API_KEYS_ENV}=k1,k2.",
    ),
    api_key_file: Path | None = typer.Option(
        None,
        "--api-key-file",
        metavar="PATH",
        help="File with one API key per line ('#' comments).",
    ),
    insecure_no_auth: bool = typer.Option(
        False, "--insecure-no-auth", help="Allow a non-loopback bind without any API key. Unsafe."
    ),
    persistence: bool = typer.Option(
        False,
        "--persistence",
        help="Prefill defaults: auto retention, prefer reuse, no TTL, no pin, experimental opt-in.",
    ),
    persistence_mode: Retention | None = typer.Option(
        None, "--persistence-mode", help="Default retention (implies --persistence)."
    ),
    persistence_reuse: Reuse | None = typer.Option(
        None, "--persistence-reuse", help="Default reuse (implies --persistence)."
    ),
    persistence_ttl_seconds: int | None = typer.Option(
        None,
        "--persistence-ttl-seconds",
        metavar="SECONDS",
        help=f"Default TTL, {TTL_MIN_SECONDS}..{TTL_MAX_SECONDS} s (implies --persistence).",
    ),
    persistence_pin: bool = typer.Option(
        False, "--persistence-pin", help="Pin new states by default (implies --persistence)."
    ),
    shutdown_grace: float = typer.Option(
        GRACEFUL_SHUTDOWN_SECONDS,
        "--shutdown-grace",
        min=0,
        max=3600,
        metavar="SECONDS",
        help="On SIGTERM/Ctrl+C, how long running requests may finish before they are "
        "cancelled (one log line each); then the backends stop and the server exits.",
    ),
    header_timeout: float = typer.Option(
        HEADER_TIMEOUT_DEFAULT,
        "--header-timeout",
        min=HEADER_TIMEOUT_MIN,
        max=HEADER_TIMEOUT_MAX,
        metavar="SECONDS",
        help="Close a connection whose request line and headers are not complete within "
        f"SECONDS ({HEADER_TIMEOUT_MIN:g}..{HEADER_TIMEOUT_MAX:g}; slow-header defence).",
    ),
    keep_alive: str = typer.Option(
        "5m",
        "--keep-alive",
        metavar="DURATION",
        help="Unload a model's runtime when it has been idle this long: seconds or 300ms, 10s, "
        "5m, 1h30m; 0 = right after each request; -1 = never. A /v1 request's own "
        '"keep_alive" (the same forms) replaces it for that model, as in Ollama. See `werk ps`.',
    ),
    preload: bool = typer.Option(
        True,
        "--preload/--no-preload",
        help="Start each --model's runtime as the server starts, so the first request does "
        "not wait for the load (a model that fails or does not fit is logged and starts on its "
        "first request; nothing loaded is unloaded for it). --no-preload: load on first use.",
    ),
    log_level: str = typer.Option(
        "warning",
        metavar="LEVEL",
        help="Log level of the server and its plugins (debug, info, warning, error).",
    ),
    quiet: bool = typer.Option(
        False,
        "--quiet",
        "-q",
        help="No access log. By default every request is logged to stderr when it ends: time, "
        "status, method, path, model, duration, client address and request id (never a body, "
        "header or key).",
    ),
    metrics_public: bool = typer.Option(
        False,
        "--metrics-public",
        help="Let loopback clients scrape GET /metrics (Prometheus) without an API key; "
        "others still need one. Without this flag /metrics needs the same key as /werk/v1.",
    ),
    event_loop: EventLoop = typer.Option(
        EventLoop.AUTO,
        "--loop",
        case_sensitive=False,
        help="The event loop: auto (uvloop where it is installed, as it is by default except "
        "on Windows; else Python's asyncio loop), uvloop, or asyncio.",
    ),
) -> None:
    """Serve the OpenAI-compatible /v1 API and Werk Protocol 1.0 under /werk/v1.

    Without an API key the server binds loopback only, runs in unauthenticated local mode
    (one shared `local` principal: not an isolation boundary) and refuses requests whose Host
    header is not a loopback name. Stop it with Ctrl+C or SIGTERM; owned backends are stopped.
    """
    from ..config import werk_home
    from ..control.service import LocalControlService, ServiceConfig
    from ..http.auth import Authenticator
    from ..http.guard import is_loopback_host
    from ..memory.filecache import cache_release_enabled
    from ..models import ModelRegistry
    from ..plugins import get_plugin_manager
    from ..state.principals import NamespaceKey, output_link_secret, principal_for_api_key

    loop_options = event_loop_options(event_loop)
    if not math.isfinite(header_timeout):  # click's FloatRange lets "nan" through
        raise typer.BadParameter(
            f"must be a number of seconds in {HEADER_TIMEOUT_MIN:g}..{HEADER_TIMEOUT_MAX:g}",
            param_hint="--header-timeout",
        )
    defaults = persistence_defaults(
        persistence=persistence,
        mode=persistence_mode,
        reuse=persistence_reuse,
        ttl_seconds=persistence_ttl_seconds,
        pin=persistence_pin,
    )
    try:
        keep_alive_seconds = parse_keep_alive(keep_alive)
    except WerkError as exc:
        raise typer.BadParameter(exc.message, param_hint="--keep-alive") from None
    keys = collect_api_keys(api_key, api_key_file)
    if not keys and not is_loopback_host(host):
        if not insecure_no_auth:
            typer.echo(
                f"error: refusing to bind {host} without an API key. Give --api-key / "
                f"--api-key-file / {API_KEYS_ENV}, bind 127.0.0.1, or pass --insecure-no-auth.",
                err=True,
            )
            raise typer.Exit(2)
        typer.echo(
            f"WARNING: serving {host} WITHOUT AUTHENTICATION (--insecure-no-auth). Anyone who "
            "can reach this port shares one principal and all of its states.",
            err=True,
        )
    home = werk_home()
    try:
        namespace_key = NamespaceKey.load_or_create(home)
        registry = ModelRegistry(home)
        manifests = [registry.get(m) for m in model]
        for manifest in manifests:
            registry.verify_unchanged(manifest)
        pm = get_plugin_manager()
        auth = Authenticator(
            keys,
            lambda k: principal_for_api_key(namespace_key, k),
            loopback_hosts_only=is_loopback_host(host),
            link_secret=output_link_secret(namespace_key),
        )
        service = LocalControlService(
            pm,
            ServiceConfig(
                home=home,
                models=manifests,
                auth_mode=auth.mode,
                namespace_key=namespace_key,
                persistence_defaults=defaults,
                keep_alive_seconds=keep_alive_seconds,
                model_cache_release=cache_release_enabled(),
                preload=preload and bool(model),
                serve_imported=not model,
            ),
        )
    except WerkError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1) from None
    from ..ports import port_in_use

    busy = port_in_use(host, port)
    if busy is not None:
        typer.echo(f"error: {busy}", err=True)
        raise typer.Exit(1)
    mode = "API keys" if auth.mode is AuthMode.API_KEY else "unauthenticated local mode"
    typer.echo(f"werk: serving on http://{host}:{port} ({mode}); WERK_HOME={home}", err=True)
    if model:
        shown = ", ".join(f"{m.id} ({m.backend})" for m in manifests)
        loading = " (loading now; --no-preload: on first use)" if preload else ""
        typer.echo(f"werk: models: {shown}{loading}", err=True)
    else:
        served = service.served()
        shown = ", ".join(f"{s.id} ({s.backend})" for s in served) or "none imported yet"
        typer.echo(
            f"werk: models: every imported model, each loaded on its first request: {shown}",
            err=True,
        )
    if service.config.model_cache_release:
        typer.echo(
            "werk: model file caches are released after unload (WERK_MODEL_CACHE_RELEASE)",
            err=True,
        )
    if not model and not service.served():
        typer.echo(
            "werk: import one with `werk models import PATH --id ID` (or `werk models "
            "create-demo`); it is served at once, no restart needed",
            err=True,
        )

    def http_server() -> uvicorn.Server:
        from ..http.access import configure_access_log
        from ..http.app import build_app
        from ..http.server import configure_logging, make_server

        configure_logging(log_level)
        configure_access_log(not quiet)
        app = build_app(service, auth, metrics_public=metrics_public)
        return make_server(
            app,
            host=host,
            port=port,
            header_timeout=header_timeout,
            shutdown_grace=shutdown_grace,
            log_level=log_level,
            on_stop=app.state.dashboard_streams.stop,
        )

    import anyio  # here, not at module level: every werk command imports this module

    anyio.run(_serve, service, http_server, backend_options=loop_options)


async def _serve(service: LocalControlService, http_server: Callable[[], uvicorn.Server]) -> None:
    """Preload the models while the HTTP stack is imported (in a worker thread: the children
    load on the other cores meanwhile), then serve until SIGINT/SIGTERM/SIGHUP. The garbage
    collector, paused by ``werk.cli.main``, resumes when both are done (at the latest
    :data:`GC_RESUME_SECONDS` after the HTTP stack). The server's
    lifespan closes ``service``, which cancels a preload still running first. The preload is a
    plain task, not a task group's: uvicorn's own exit (``SystemExit`` when the port is taken)
    must reach the CLI as it is, not wrapped in an exception group."""
    import asyncio

    import anyio

    preloading = asyncio.ensure_future(service.preload())
    switch = sys.getswitchinterval()
    sys.setswitchinterval(STARTUP_SWITCH_INTERVAL)
    try:
        try:
            server = await anyio.to_thread.run_sync(http_server)
        finally:
            sys.setswitchinterval(switch)
        # Started: the garbage collector resumes (werk.cli._gc) once the preload is done too,
        # or GC_RESUME_SECONDS from now if that takes longer (a large model, vLLM).
        if preloading.done():
            _gc.resume()
        else:
            preloading.add_done_callback(lambda _: _gc.resume())
            asyncio.get_running_loop().call_later(GC_RESUME_SECONDS, _gc.resume)
        signal.signal(signal.SIGHUP, lambda *_: server.handle_exit(signal.SIGTERM, None))
        await server.serve()
    finally:
        with anyio.CancelScope(shield=True):
            await service.aclose()  # a no-op after the lifespan's (e.g. Ctrl+C while importing)
            await asyncio.gather(preloading, return_exceptions=True)
