"""What every ``werk runtime`` command shares: options, the connection, error reporting.

A command declares the connection options (:data:`ServerOpt`, :data:`KeyFileOpt`,
:data:`TimeoutOpt`) and :data:`JsonOpt` last, bundles the first three into a
:class:`Connection`, and hands the request to :func:`respond`, which connects, makes the call,
turns a :class:`WerkError` into exit status 1 and prints the response (``--json``: one line of
JSON; otherwise the command's own renderer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ...protocol import InvalidRequest, Unavailable, WerkError, WerkTimeout
from .._output import emit_json

if TYPE_CHECKING:
    from ...client import WerkClient

__all__ = [
    "DEFAULT_SERVER",
    "DEFAULT_TIMEOUT",
    "SERVER_ENV",
    "Connection",
    "ExecuteOpt",
    "JsonOpt",
    "KeyFileOpt",
    "ServerOpt",
    "TimeoutOpt",
    "connect",
    "describe_error",
    "model_option",
    "read_bounded",
    "read_key_file",
    "reporting",
    "respond",
]

SERVER_ENV = "WERK_SERVER"
DEFAULT_SERVER = "http://127.0.0.1:11434"
"""Equal to :data:`werk.client.DEFAULT_SERVER`; repeated so that every other `werk` command
does not pay for importing httpx (the client is imported when a runtime command connects)."""
DEFAULT_TIMEOUT = 300.0
MAX_KEY_FILE_BYTES = 64 * 1024

_T = TypeVar("_T")

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


def model_option(help: str) -> Any:
    """``--model ID``; only the help text differs between commands."""
    return typer.Option("--model", metavar="ID", help=help)


# -- the connection --------------------------------------------------------------------------


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


def read_bounded(path: Path, limit: int, param_hint: str) -> bytes:
    """Up to ``limit + 1`` bytes of ``path`` (one more than allowed shows it is too large).

    :raises typer.BadParameter: when the file cannot be read (usage error, exit 2).
    """
    try:
        with path.open("rb") as handle:
            return handle.read(limit + 1)
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {path}: {exc.strerror}", param_hint=param_hint
        ) from None


def read_key_file(path: Path) -> str:
    """The first non-empty line of ``path`` that is not a ``#`` comment (bounded read)."""
    data = read_bounded(path, MAX_KEY_FILE_BYTES, "--api-key-file")
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


# -- errors ----------------------------------------------------------------------------------


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
    """Turn a :class:`WerkError` into ``error: …`` on stderr (or the JSON body) and exit 1.

    Unlike :func:`werk.cli._output.reporting_errors` the line names the code, capability and
    request id, the JSON body keeps the request id, and an unreachable server gets a hint.
    """
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

    A malformed ``--server`` is a usage error (exit 2), not a Werk error. The client (and so
    httpx) is imported only here, so other `werk` commands do not pay for it.
    """
    from ...client import WerkClient

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


def respond(
    conn: Connection,
    as_json: bool,
    call: Callable[[WerkClient], _T],
    render: Callable[[_T], None],
) -> None:
    """The shape of most commands: connect, make one ``call``, print its response.

    With ``--json`` the response Struct is printed as one line of JSON, otherwise ``render``
    prints it for people. Printing happens after the client is closed.
    """
    with connect(conn, as_json) as client:
        response = call(client)
    if as_json:
        emit_json(response)
        return
    render(response)
