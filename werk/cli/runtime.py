"""``werk runtime …``: control a running ``werk serve`` through the bundled :class:`WerkClient`.

Every command talks to one server (``--server URL``, ``$WERK_SERVER``, default
``http://127.0.0.1:11434``). The API key comes from ``$WERK_API_KEY`` or ``--api-key-file PATH``,
never from a command-line value, so it stays out of shell history and the process table.

Output conventions shared by every command here:

* ``--json`` prints the protocol response Struct as one line of JSON on stdout.
* A Werk error exits 1: ``error: <message> (<code>, capability …, request_id …)`` on stderr, or
  with ``--json`` the protocol error body on stdout. Usage errors exit 2 (click's convention).
* Colour and box drawing only when the stream is a terminal.
* Mutations preview (``dry_run: true``) unless ``--execute`` is given.

The ``states`` sub-commands live in :mod:`werk.cli.runtime_states`, which registers itself on
:data:`runtime_app` when imported (this module imports it at the end).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO

import msgspec
import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..protocol import (
    CapabilitiesResponse,
    CapabilityStatus,
    DecodeRequest,
    DecodeResponse,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    ExpertTier,
    InfoResponse,
    InvalidRequest,
    MemoryResponse,
    PayloadTooLarge,
    Policy,
    PrefillRequest,
    PrefillResponse,
    PressureLevel,
    Retention,
    Reuse,
    StateSummary,
    Unavailable,
    WerkError,
    WerkTimeout,
)
from ..protocol.policy import TTL_MAX_SECONDS, TTL_MIN_SECONDS
from ..protocol.prefill import MAX_DECODE_TOKENS, MAX_PROMPT_CHARS
from ._app import app
from ._output import emit_json

if TYPE_CHECKING:
    from ..client import WerkClient

__all__ = [
    "DEFAULT_SERVER",
    "DEFAULT_TIMEOUT",
    "SERVER_ENV",
    "STATE_COLUMNS",
    "Connection",
    "ExecuteOpt",
    "JsonOpt",
    "KeyFileOpt",
    "ServerOpt",
    "TimeoutOpt",
    "connect",
    "console",
    "describe_error",
    "runtime_app",
    "show",
    "size",
    "state_rows",
    "table",
]

SERVER_ENV = "WERK_SERVER"
DEFAULT_SERVER = "http://127.0.0.1:11434"
"""Equal to :data:`werk.client.DEFAULT_SERVER`; repeated so that every other `werk` command
does not pay for importing httpx (the client is imported when a runtime command connects)."""
DEFAULT_TIMEOUT = 300.0
MAX_KEY_FILE_BYTES = 64 * 1024
MAX_PROMPT_BYTES = 4 * MAX_PROMPT_CHARS  # UTF-8 needs at most four bytes per character

runtime_app = typer.Typer(
    name="runtime",
    help=(
        "Control a running `werk serve` through its /werk/v1 API: server info, the capability "
        "matrix, live memory, named states, prefill/decode and expert residency.\n\n"
        f"The server is --server URL (or ${SERVER_ENV}; default {DEFAULT_SERVER}). The API key "
        "is read from $WERK_API_KEY or --api-key-file PATH, never from a command-line value. "
        "Every listing takes --json (the protocol response, one line). Commands that change "
        "something preview by default and act only with --execute.\n\n"
        "Exit codes: 0 success, 1 an error the server or client reported "
        "(`error: <message> (<code>, …)`), 2 a usage error. `werk plugins` and "
        "`werk capabilities` describe the local installation without a server."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(runtime_app, name="runtime")

# -- options every command shares ------------------------------------------------------------

ServerOpt = Annotated[
    str,
    typer.Option(
        "--server",
        envvar=SERVER_ENV,
        metavar="URL",
        help="The running `werk serve`, http://host:port.",
    ),
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-key-file",
        metavar="PATH",
        exists=True,
        dir_okay=False,
        help="Read the API key from the first non-empty, non-'#' line of PATH "
        "(default: $WERK_API_KEY).",
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.1,
        max=86_400.0,
        metavar="SECONDS",
        help="Give up on a request after SECONDS (a long prefill may need more).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print the protocol response as one line of JSON.")
]
ExecuteOpt = Annotated[
    bool,
    typer.Option("--execute", help="Actually do it. Without this flag the server only previews."),
]


@dataclass(frozen=True)
class Connection:
    """Where to send requests and how to authenticate: the shared command options."""

    server: str
    api_key_file: Path | None
    timeout: float

    def api_key(self) -> str | None:
        """The key from ``--api-key-file``; ``None`` lets the client read ``$WERK_API_KEY``."""
        if self.api_key_file is None:
            return None
        return read_key_file(self.api_key_file)


def read_key_file(path: Path) -> str:
    """The first non-empty line of ``path`` that is not a ``#`` comment (bounded read)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {path}: {exc.strerror}", param_hint="--api-key-file"
        ) from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise typer.BadParameter(
            f"{path} is larger than {MAX_KEY_FILE_BYTES} bytes", param_hint="--api-key-file"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise typer.BadParameter(f"{path} is not UTF-8", param_hint="--api-key-file") from None
    for line in text.splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            return key
    raise typer.BadParameter(f"{path} contains no key", param_hint="--api-key-file")


def describe_error(exc: WerkError) -> str:
    """``<message> (<code>, capability <id>, request_id <id>)`` — one line for stderr."""
    details = [str(exc.code)]
    if exc.capability:
        details.append(f"capability {exc.capability}")
    if exc.request_id:
        details.append(f"request_id {exc.request_id}")
    return f"{exc.message} ({', '.join(details)})"


@contextmanager
def reporting(as_json: bool, server: str) -> Iterator[None]:
    """Turn a :class:`WerkError` into ``error: …`` on stderr (or the JSON body) and exit 1."""
    try:
        yield
    except WerkError as exc:
        if as_json:
            emit_json(exc.to_body(exc.request_id))
        else:
            typer.echo(f"error: {describe_error(exc)}", err=True)
            if isinstance(exc, Unavailable | WerkTimeout) and exc.request_id is None:
                typer.echo(
                    f"hint: is `werk serve` running at {server}? "
                    f"Choose another with --server URL or ${SERVER_ENV}.",
                    err=True,
                )
        raise typer.Exit(1) from None


@contextmanager
def connect(conn: Connection, as_json: bool) -> Iterator[WerkClient]:
    """A client for ``conn``, closed afterwards; Werk errors inside become exit status 1.

    A malformed ``--server`` is a usage error (exit 2), not a Werk error.
    """
    from ..client import WerkClient

    key = conn.api_key()
    try:
        client = WerkClient(conn.server, api_key=key, timeout=conn.timeout)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message, param_hint="--server") from None
    try:
        with reporting(as_json, conn.server):
            yield client
    finally:
        client.close()


# -- rendering -------------------------------------------------------------------------------


def console(stream: TextIO | None = None) -> Console:
    """A console on ``stream`` (stdout by default): colour only when it is a terminal."""
    out = stream if stream is not None else sys.stdout
    tty = out.isatty()
    return Console(
        file=out,
        no_color=not tty,
        width=None if tty else 400,
        soft_wrap=False,
        highlight=False,
        markup=False,
    )


def show(renderable: RenderableType | str, stream: TextIO | None = None) -> None:
    """Print ``renderable``; off a terminal, without colour and without trailing blanks."""
    out = stream if stream is not None else sys.stdout
    target = console(out)
    if out.isatty():
        target.print(renderable)
        return
    with target.capture() as captured:
        target.print(renderable)
    out.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
    out.flush()


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A plain, borderless table. ``None`` cells show as ``-``; rich ``Text`` keeps its style."""
    result = Table(
        title=title,
        title_justify="left",
        box=None,
        pad_edge=False,
        show_header=any(columns),
    )
    for index, column in enumerate(columns):
        result.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        result.add_row(*(_cell(cell) for cell in row))
    return result


def _cell(value: Any) -> RenderableType:
    if isinstance(value, Text):
        return value
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def size(value: int | None, unknown: str = "unknown") -> str:
    """``1.5 GiB``-style size; ``None`` is ``unknown`` (never shown as zero)."""
    if value is None:
        return unknown
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(amount) < 1024 or unit == "TiB":
            return f"{value} B" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


_STATUS_STYLE = {
    CapabilityStatus.SUPPORTED: "green",
    CapabilityStatus.EXPERIMENTAL: "yellow",
    CapabilityStatus.UNAVAILABLE: "red",
    CapabilityStatus.UNSUPPORTED: "dim",
    CapabilityStatus.EXTERNALLY_MANAGED: "cyan",
    CapabilityStatus.METADATA_ONLY: "blue",
}
_PRESSURE_STYLE = {
    PressureLevel.NORMAL: "green",
    PressureLevel.SOFT: "yellow",
    PressureLevel.HARD: "red",
    PressureLevel.EMERGENCY: "bold red",
    PressureLevel.UNKNOWN: "dim",
}


def state_rows(states: Sequence[StateSummary]) -> list[list[Any]]:
    """Table rows for state summaries (see :data:`STATE_COLUMNS`)."""
    return [
        [
            s.id,
            s.model,
            s.tier.value,
            s.status.value,
            size(s.logical_bytes),
            s.created_at,
            s.last_accessed_at,
            s.expires_at or "never",
            s.pinned,
            s.reusable,
        ]
        for s in states
    ]


STATE_COLUMNS = (
    "ID",
    "MODEL",
    "TIER",
    "STATUS",
    "SIZE",
    "CREATED",
    "LAST USED",
    "EXPIRES",
    "PINNED",
    "REUSABLE",
)


# -- info / capabilities ---------------------------------------------------------------------


@runtime_app.command()
def info(
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show the server: protocol and Werk version, authentication mode, loaded plugins,
    configured models and the prefill persistence defaults (GET /werk/v1/info)."""
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        response = client.info()
    if as_json:
        emit_json(response)
        return
    _print_info(server, response)


def _print_info(server: str, response: InfoResponse) -> None:
    auth = response.server.auth.value
    if auth == "unauthenticated_local":
        auth += " (one shared `local` principal: not an isolation boundary)"
    defaults = response.persistence_defaults
    persistence = (
        "none (a prefill without a policy is ephemeral)"
        if defaults is None
        else f"retention {defaults.retention}, reuse {defaults.reuse}, "
        f"ttl {defaults.ttl_seconds or 'none'}, pin {_yes(defaults.pin)}, "
        f"allow_experimental {_yes(defaults.allow_experimental)}"
    )
    show(
        table(
            "Server",
            ("", ""),
            [
                ("url", server),
                ("protocol", response.protocol),
                ("werk", response.werk_version),
                ("started", response.server.started_at),
                ("auth", auth),
                ("persistence defaults", persistence),
            ],
        )
    )
    show("")
    if response.models:
        show(table("Models", ("ID", "BACKEND"), [(m.id, m.backend) for m in response.models]))
    else:
        show("Models: none configured (start the server with --model ID)")
    show("")
    show(
        table(
            "Plugins",
            ("NAME", "VERSION", "STATUS", "BACKENDS", "ERROR"),
            [
                (p.name, p.version, p.status.value, ",".join(p.backends), p.error)
                for p in response.plugins
            ],
        )
    )


def _yes(value: bool) -> str:
    return "yes" if value else "no"


@runtime_app.command("capabilities")
def capabilities_command(
    model: Annotated[
        str | None, typer.Option("--model", metavar="ID", help="Only rows for this model.")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show the running server's capability matrix (GET /werk/v1/capabilities).

    Each row is one capability of one backend (and model, when known). Statuses are shown
    exactly as reported — supported, unsupported, unavailable, experimental,
    externally_managed, metadata_only — and anything but `supported` carries a reason. An
    `experimental` capability needs `allow_experimental: true` (e.g. prefill
    --allow-experimental). Host-level rows (telemetry) have no model.
    """
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        response = client.capabilities(model=model)
    if as_json:
        emit_json(response)
        return
    _print_capabilities(response)


def _print_capabilities(response: CapabilitiesResponse) -> None:
    rows = [
        (
            r.id,
            Text(r.status.value, style=_STATUS_STYLE.get(r.status, "")),
            r.backend,
            r.model,
            r.reason,
        )
        for r in response.capabilities
    ]
    if not rows:
        show("No capabilities reported.")
        return
    show(table("Capabilities", ("ID", "STATUS", "BACKEND", "MODEL", "REASON"), rows))


# -- memory ----------------------------------------------------------------------------------


def render_memory(m: MemoryResponse, note: str | None = None) -> RenderableType:
    """The memory view: one row per resource, then Werk's accounting and counters."""
    title = f"Memory at {m.sampled_at}" + (f"  ({note})" if note else "")
    rows: list[tuple[Any, ...]] = []
    if m.host is None:
        rows.append(("host", "not observed", "not observed", "not observed"))
    else:
        h = m.host
        rows.append(("host", size(h.total_bytes), size(h.used_bytes), size(h.available_bytes)))
    if m.accelerators is None:
        rows.append(("accelerators", "could not sample", None, None))
    elif not m.accelerators:
        rows.append(("accelerators", "none present", None, None))
    for a in m.accelerators or []:
        free = (
            None if a.total_bytes is None or a.used_bytes is None else a.total_bytes - a.used_bytes
        )
        rows.append(
            (
                f"gpu{a.index} {a.name}",
                size(a.total_bytes, "not observed"),
                size(a.used_bytes, "not observed"),
                size(free, "not observed"),
            )
        )
    resources = table(title, ("RESOURCE", "TOTAL", "USED", "AVAILABLE"), rows)
    c = m.counters
    accounting = table(
        None,
        ("", ""),
        [
            ("pressure", Text(m.pressure.value, style=_PRESSURE_STYLE.get(m.pressure, ""))),
            ("unified memory", m.unified),
            ("managed allocated", size(m.managed.allocated_bytes)),
            ("managed reserved", size(m.managed.reserved_bytes)),
            ("failed_releases", c.failed_releases),
            ("orphaned_release_bytes", c.orphaned_release_bytes),
            ("telemetry_errors", c.telemetry_errors),
            ("backend_cleanup_failures", c.backend_cleanup_failures),
            ("backend_cleanup_latched", c.backend_cleanup_latched),
        ],
    )
    return Group(resources, Text(""), accounting)


@runtime_app.command()
def memory(
    watch: Annotated[
        bool, typer.Option("--watch", help="Keep refreshing, like `top` (Ctrl+C to quit).")
    ] = False,
    interval: Annotated[
        float | None,
        typer.Option(
            "--interval",
            min=0.05,
            max=3600.0,
            metavar="SECONDS",
            help="Seconds between samples with --watch [default: 2].",
        ),
    ] = None,
    count: Annotated[
        int | None,
        typer.Option("--count", min=1, metavar="N", help="With --watch: stop after N samples."),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Show host and accelerator memory, Werk's managed allocations and reservations, the
    pressure level and the failure counters (GET /werk/v1/memory).

    `not observed` means Werk could not measure it (never shown as zero). With --watch the view
    refreshes in place on a terminal; when stdout is not a terminal one snapshot (a table, or
    one JSON line with --json) is printed per interval. --count N stops after N snapshots;
    Ctrl+C stops cleanly with exit status 0.
    """
    if not watch and (interval is not None or count is not None):
        raise typer.BadParameter(
            "--interval and --count only apply together with --watch", param_hint="'--watch'"
        )
    period = 2.0 if interval is None else interval
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        if not watch:
            _print_memory_once(client.memory(), as_json)
            return
        try:
            if sys.stdout.isatty() and not as_json:
                _watch_live(client, period, count)
            else:
                _watch_lines(client, period, count, as_json)
        except KeyboardInterrupt:
            return


def _print_memory_once(m: MemoryResponse, as_json: bool) -> None:
    if as_json:
        emit_json(m)
    else:
        show(render_memory(m))


def _watch_lines(client: WerkClient, period: float, count: int | None, as_json: bool) -> None:
    shown = 0
    while True:
        _print_memory_once(client.memory(), as_json)
        if not as_json:
            sys.stdout.write("\n")
        sys.stdout.flush()
        shown += 1
        if count is not None and shown >= count:
            return
        time.sleep(period)


def _watch_live(client: WerkClient, period: float, count: int | None) -> None:
    from rich.live import Live

    note = f"every {period:g}s, Ctrl+C to quit"
    shown = 1
    first = render_memory(client.memory(), note)
    with Live(first, console=console(), auto_refresh=False) as live:
        live.refresh()
        while count is None or shown < count:
            time.sleep(period)
            live.update(render_memory(client.memory(), note), refresh=True)
            shown += 1


# -- prefill / decode ------------------------------------------------------------------------


def read_prompt(prompt: str | None, file: Path | None) -> str:
    """The prompt from exactly one source: the argument, ``-`` (stdin) or ``--file``."""
    if (prompt is None) == (file is None):
        raise typer.BadParameter(
            "give exactly one of PROMPT, - (read stdin) or --file F", param_hint="'PROMPT'"
        )
    if prompt is not None and prompt != "-":
        return prompt
    if file is None or str(file) == "-":
        return _decode_prompt(sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1), "stdin")
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_PROMPT_BYTES + 1)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {file}: {exc.strerror}", param_hint="--file"
        ) from None
    return _decode_prompt(data, str(file))


def _decode_prompt(data: bytes, source: str) -> str:
    if len(data) > MAX_PROMPT_BYTES:
        raise PayloadTooLarge(f"the prompt from {source} is over {MAX_PROMPT_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"the prompt from {source} is not UTF-8 ({exc.reason})") from None
    if len(text) > MAX_PROMPT_CHARS:
        raise PayloadTooLarge(f"the prompt from {source} is over {MAX_PROMPT_CHARS} characters")
    return text


def build_prefill(
    *,
    model: str,
    prompt: str,
    retention: Retention | None,
    reuse: Reuse | None,
    ttl: int | None,
    pin: bool,
    allow_experimental: bool | None,
) -> PrefillRequest:
    """Absent flags stay absent (server defaults apply); any policy flag sends a complete
    policy whose other members take the protocol defaults."""
    policy: Policy | msgspec.UnsetType = msgspec.UNSET
    if retention is not None or reuse is not None or ttl is not None or pin:
        policy = Policy(
            retention=retention or Retention.EPHEMERAL,
            reuse=reuse or Reuse.DISABLED,
            ttl_seconds=ttl,
            pin=pin,
        )
    return PrefillRequest(
        model=model,
        prompt=prompt,
        policy=policy,
        allow_experimental=msgspec.UNSET if allow_experimental is None else allow_experimental,
    )


@runtime_app.command()
def prefill(
    model: Annotated[str, typer.Option("--model", metavar="ID", help="The model id.")],
    prompt: Annotated[
        str | None,
        typer.Argument(metavar="PROMPT", help="The prompt text, or - to read it from stdin."),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            metavar="F",
            help="Read the prompt (UTF-8) from file F instead (- is stdin).",
        ),
    ] = None,
    retention: Annotated[
        Retention | None,
        typer.Option(
            "--retention",
            help="ephemeral: only a handoff; memory: require a RAM/VRAM state; disk: require a "
            "disk snapshot; auto: disk when possible, else a volatile state.",
        ),
    ] = None,
    reuse: Annotated[
        Reuse | None,
        typer.Option(
            "--reuse",
            help="disabled; prefer: reuse a compatible state if there is one; required: fail "
            "unless reuse is proven.",
        ),
    ] = None,
    ttl: Annotated[
        int | None,
        typer.Option(
            "--ttl",
            min=TTL_MIN_SECONDS,
            max=TTL_MAX_SECONDS,
            metavar="SECONDS",
            help="Time to live of the named state.",
        ),
    ] = None,
    pin: Annotated[
        bool, typer.Option("--pin", help="Pin the new state against pruning and demotion.")
    ] = False,
    allow_experimental: Annotated[
        bool | None,
        typer.Option(
            "--allow-experimental/--no-allow-experimental",
            help="Opt in to (or explicitly refuse) experimental capabilities. Absent: the "
            "server's persistence defaults decide.",
            show_default=False,
        ),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Prefill PROMPT on a model and get a single-use decode handoff (POST /werk/v1/prefill).

    Without --retention/--reuse/--ttl/--pin no policy is sent, so the server's persistence
    defaults apply (see `werk runtime info`); any of them sends a complete policy whose other
    members take the protocol defaults (ephemeral, reuse disabled, no TTL, not pinned).

    The summary (state, reuse outcome, usage) goes to stderr and the handoff token — shown
    exactly once — is the only line on stdout, so `TOKEN=$(werk runtime prefill …)` followed
    by `werk runtime decode "$TOKEN"` works. With --json the protocol response is printed.
    """
    conn = Connection(server, api_key_file, timeout)
    with connect(conn, as_json) as client:
        request = build_prefill(
            model=model,
            prompt=read_prompt(prompt, file),
            retention=retention,
            reuse=reuse,
            ttl=ttl,
            pin=pin,
            allow_experimental=allow_experimental,
        )
        with _busy("prefilling"):
            response = client.prefill(request)
    if as_json:
        emit_json(response)
        return
    _print_prefill(response)


@contextmanager
def _busy(what: str) -> Iterator[None]:
    """A spinner on stderr while waiting, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with console(sys.stderr).status(f"{what}…"):
        yield


def _print_prefill(response: PrefillResponse) -> None:
    s = response.state
    state = (
        "none (ephemeral: only the handoff below)"
        if s is None
        else f"{s.id}  {s.tier.value}  {s.status.value}  {size(s.logical_bytes)}  "
        f"expires {s.expires_at or 'never'}  {'pinned' if s.pinned else 'not pinned'}"
    )
    reuse = response.reuse.outcome.value
    if response.reuse.state_id:
        reuse += f" (from {response.reuse.state_id})"
    cached = response.usage.cached_tokens
    show(
        table(
            None,
            ("", ""),
            [
                ("state", state),
                ("reuse", reuse),
                (
                    "usage",
                    f"{response.usage.prompt_tokens} prompt tokens, "
                    f"{'unknown' if cached is None else cached} cached",
                ),
                (
                    "handoff",
                    f"single use, expires {response.handoff.expires_at}; token on stdout:",
                ),
            ],
        ),
        sys.stderr,
    )
    typer.echo(response.handoff.token)


def _read_handoff(handoff: str) -> str:
    if handoff != "-":
        return handoff
    token = sys.stdin.read(1024).strip()
    if not token:
        raise typer.BadParameter("- given but stdin was empty", param_hint="'HANDOFF'")
    return token


@runtime_app.command()
def decode(
    handoff: Annotated[
        str,
        typer.Argument(
            metavar="HANDOFF", help="The wh_… token printed by prefill, or - to read it from stdin."
        ),
    ],
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=1, max=MAX_DECODE_TOKENS, metavar="N")
    ] = 64,
    temperature: Annotated[
        float, typer.Option("--temperature", min=0.0, max=2.0, metavar="T")
    ] = 0.0,
    seed: Annotated[int | None, typer.Option("--seed", min=0, max=2**63 - 1, metavar="S")] = None,
    stop: Annotated[
        list[str] | None,
        typer.Option("--stop", metavar="STR", help="Stop before STR (repeatable, up to 16)."),
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Decode from a prefill handoff (POST /werk/v1/decode) and print the completion.

    The handoff is consumed before the backend runs: a second use, even after a failed decode,
    is refused with `invalid_handoff`. The text goes to stdout; the finish reason, usage and
    any follow-up state or handoff go to stderr. With --json the protocol response is printed.
    """
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        request = DecodeRequest(
            handoff=_read_handoff(handoff),
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=list(stop or []),
        )
        with _busy("decoding"):
            response = client.decode(request)
    if as_json:
        emit_json(response)
        return
    _print_decode(response)


def _print_decode(response: DecodeResponse) -> None:
    text = response.text
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    notes = [
        f"finish: {response.finish_reason.value}, "
        f"{response.usage.completion_tokens} completion tokens"
    ]
    if response.state is not None:
        notes.append(f"state: {response.state.id} ({response.state.tier.value})")
    if response.handoff is not None:
        notes.append(
            f"next handoff (single use, expires {response.handoff.expires_at}): "
            f"{response.handoff.token}"
        )
    for note in notes:
        typer.echo(note, err=True)


# -- experts ---------------------------------------------------------------------------------

experts_app = typer.Typer(
    name="experts",
    help=(
        "Expert residency of a mixture-of-experts model. `werk runtime experts --model ID` "
        "lists the experts the backend observed (tier, size, hotness, pin); `prefetch` and "
        "`evict` move them and preview unless --execute. An adapter without expert control "
        "answers `unsupported` and names the capability (runtime.experts.residency)."
    ),
    invoke_without_command=True,
    rich_markup_mode=None,
)
runtime_app.add_typer(experts_app, name="experts")


@experts_app.callback()
def experts(
    ctx: typer.Context,
    model: Annotated[
        str | None, typer.Option("--model", metavar="ID", help="The model to list.")
    ] = None,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """List a model's experts (GET /werk/v1/experts?model=ID), or run a sub-command."""
    if ctx.invoked_subcommand is not None:
        given = [
            name
            for name in ("model", "server", "api_key_file", "timeout", "as_json")
            if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
        ]
        if given:
            raise typer.BadParameter(
                f"put options after the sub-command: `werk runtime experts "
                f"{ctx.invoked_subcommand} --model ID …`",
                ctx=ctx,
                param_hint="'experts'",
            )
        return
    if model is None:
        raise typer.BadParameter(
            "give --model ID, or a sub-command (prefetch, evict)", ctx=ctx, param_hint="'--model'"
        )
    with connect(Connection(server, api_key_file, timeout), as_json) as client:
        listing = client.experts(model)
    if as_json:
        emit_json(listing)
        return
    _print_experts(listing)


def _print_experts(listing: ExpertList) -> None:
    if not listing.experts:
        show(f"No experts observed for {listing.model}.")
        return
    show(
        table(
            f"Experts of {listing.model}",
            ("ID", "TIER", "SIZE", "HOTNESS", "PINNED"),
            [
                (e.id, e.tier.value, size(e.bytes), f"{e.hotness:.3f}", e.pinned)
                for e in listing.experts
            ],
        )
    )


def _expert_action(
    action: Literal["prefetch", "evict"],
    *,
    model: str,
    expert_ids: list[str],
    target: ExpertTier,
    allow_experimental: bool,
    execute: bool,
    conn: Connection,
    as_json: bool,
) -> None:
    with connect(conn, as_json) as client:
        request = ExpertActionRequest(
            experts=expert_ids,
            target=target,
            dry_run=not execute,
            allow_experimental=allow_experimental,
        )
        result = client.expert_action(model, action, request)
    if as_json:
        emit_json(result)
        return
    _print_expert_result(action, result)


def _print_expert_result(action: str, result: ExpertActionResult) -> None:
    rows: list[tuple[Any, ...]] = [
        (a.id, a.from_.value, a.to.value, "planned") for a in result.planned
    ]
    rows += [(a.id, a.from_.value, a.to.value, "applied") for a in result.applied]
    rows += [(s.id, None, None, f"skipped: {s.reason}") for s in result.skipped]
    if rows:
        show(table(f"Expert {action}", ("ID", "FROM", "TO", "RESULT"), rows))
    else:
        show(f"Nothing to {action}.")
    if result.dry_run:
        show("Preview only: nothing was moved. Run again with --execute to apply.")


ExpertsArg = Annotated[
    list[str], typer.Argument(metavar="EXPERT...", help="Expert ids (see `experts --model`).")
]
ExpertModelOpt = Annotated[str, typer.Option("--model", metavar="ID", help="The model.")]
TargetOpt = Annotated[ExpertTier, typer.Option("--target", help="The tier to move the experts to.")]
AllowExperimentalOpt = Annotated[
    bool,
    typer.Option("--allow-experimental", help="Opt in when expert residency is `experimental`."),
]


@experts_app.command()
def prefetch(
    expert_ids: ExpertsArg,
    model: ExpertModelOpt,
    target: TargetOpt = ExpertTier.RAM,
    allow_experimental: AllowExperimentalOpt = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Move experts into a faster tier (POST /werk/v1/experts/ID/prefetch).

    Previews the plan (planned moves and skips) unless --execute. Needs --allow-experimental
    while the capability is experimental.
    """
    _expert_action(
        "prefetch",
        model=model,
        expert_ids=expert_ids,
        target=target,
        allow_experimental=allow_experimental,
        execute=execute,
        conn=Connection(server, api_key_file, timeout),
        as_json=as_json,
    )


@experts_app.command()
def evict(
    expert_ids: ExpertsArg,
    model: ExpertModelOpt,
    target: TargetOpt = ExpertTier.RAM,
    allow_experimental: AllowExperimentalOpt = False,
    execute: ExecuteOpt = False,
    server: ServerOpt = DEFAULT_SERVER,
    api_key_file: KeyFileOpt = None,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT,
    as_json: JsonOpt = False,
) -> None:
    """Move experts out to a slower tier (POST /werk/v1/experts/ID/evict).

    Previews the plan (planned moves and skips) unless --execute. Pinned experts are skipped.
    Needs --allow-experimental while the capability is experimental.
    """
    _expert_action(
        "evict",
        model=model,
        expert_ids=expert_ids,
        target=target,
        allow_experimental=allow_experimental,
        execute=execute,
        conn=Connection(server, api_key_file, timeout),
        as_json=as_json,
    )


from . import runtime_states  # noqa: E402, F401  (registers `werk runtime states`)
