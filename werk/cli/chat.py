"""``werk run`` and ``werk chat``: talk to a model, locally or through a running server.

Without ``--server`` the model's runtime is started in this process and stopped (its processes
reaped) when the command ends — also on Ctrl+C, SIGTERM or SIGHUP. With ``--server URL`` the
requests go through that ``werk serve``'s ``/v1/chat/completions``; its live runtime answers.

``--persistence`` (or ``--session NAME``) keeps the conversation in a private archive under
``WERK_HOME/chat-sessions/NAME`` (default NAME: the model id) on this machine, for either route;
a later ``werk run``/``werk chat`` with the same session resends that history. Exit codes: 0
success, 1 an error Werk reported, 2 a usage error, 128+N when ended by signal N (130 Ctrl+C).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..protocol import InvalidRequest, WerkError
from ._app import app
from ._output import emit_json

if TYPE_CHECKING:
    from ..chat.render import Diagnostics
    from ..chat.session import ChatEngine, Conversation

__all__ = ["chat", "read_prompt", "run"]

MAX_PROMPT_BYTES = 16 * 1024 * 1024

ModelArg = Annotated[
    str, typer.Argument(metavar="MODEL", help="An imported model id (see `werk models list`).")
]
ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        metavar="URL",
        help="Send requests through this running `werk serve` (http://host:port) instead of "
        "starting the model here. Its live runtime answers; the session archive stays local.",
    ),
]
KeyFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--api-key-file",
        metavar="PATH",
        exists=True,
        dir_okay=False,
        help="With --server: the API key is the first non-'#' line of PATH "
        "(default: $WERK_API_KEY).",
    ),
]
SessionOpt = Annotated[
    str | None,
    typer.Option(
        "--session",
        metavar="NAME",
        help="Keep the conversation in the archive NAME and resume it if it exists "
        "(implies --persistence).",
    ),
]
PersistenceOpt = Annotated[
    bool,
    typer.Option(
        "--persistence",
        help="Save and resume the conversation (session name: --session, else the model id). "
        "Text only: this never claims native KV reuse.",
    ),
]
SystemOpt = Annotated[
    str | None,
    typer.Option("--system", metavar="TEXT", help="System prompt (replaces a saved one)."),
]
TemperatureOpt = Annotated[
    float | None, typer.Option("--temperature", min=0.0, max=2.0, help="Sampling temperature.")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", min=0, max=2**32 - 1, help="Sampling seed.")]
MaxTokensOpt = Annotated[
    int | None,
    typer.Option("--max-tokens", min=1, max=1_000_000, help="Stop after this many tokens."),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=0.1,
        max=86_400.0,
        metavar="SECONDS",
        help="With --server: give up when the server is silent this long.",
    ),
]
VerboseOpt = Annotated[
    bool, typer.Option("-v", "--verbose", help="Print phase diagnostics to stderr.")
]


def read_prompt(prompt: str | None) -> str:
    """The prompt argument, or stdin when it is absent or ``-`` (bounded, UTF-8).

    :raises typer.BadParameter: empty, too large or not UTF-8 (usage error, exit 2).
    """
    if prompt is not None and prompt != "-":
        text = prompt
    else:
        if sys.stdin.isatty():
            typer.echo("werk: reading the prompt from stdin; end it with Ctrl+D", err=True)
        data = sys.stdin.buffer.read(MAX_PROMPT_BYTES + 1)
        if len(data) > MAX_PROMPT_BYTES:
            raise typer.BadParameter(
                f"stdin is larger than {MAX_PROMPT_BYTES} bytes", param_hint="PROMPT"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise typer.BadParameter("stdin is not UTF-8", param_hint="PROMPT") from None
    if not text.strip():
        raise typer.BadParameter("the prompt is empty", param_hint="PROMPT")
    return text


def _session_name(model: str, session: str | None, persistence: bool) -> str | None:
    from ..chat.archive import validate_session_name

    name = session if session is not None else (model if persistence else None)
    if name is None:
        return None
    try:
        return validate_session_name(name)
    except InvalidRequest as exc:
        raise typer.BadParameter(exc.message, param_hint="--session") from None


@contextlib.contextmanager
def _reporting(as_json: bool) -> Iterator[None]:
    """Werk errors exit 1 (JSON body with --json); interruptions exit 128+signal."""
    from ..chat.signals import Terminated, exit_code_for

    try:
        yield
    except WerkError as exc:
        if as_json:
            emit_json(exc.to_body())
        else:
            typer.echo(f"error: {exc.message} ({exc.code})", err=True)
        raise typer.Exit(1) from None
    except BrokenPipeError:
        # stdout went away (`werk run … | head`): stop quietly; nothing more can be shown.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise typer.Exit(1) from None
    except (KeyboardInterrupt, Terminated) as exc:
        sys.stdout.flush()
        what = str(exc) if isinstance(exc, Terminated) else "interrupted"
        typer.echo(f"\nwerk: {what}; everything this command started was stopped", err=True)
        raise typer.Exit(exit_code_for(exc)) from None


@contextlib.contextmanager
def _conversation_and_engine(
    *,
    model: str,
    server: str | None,
    api_key_file: Path | None,
    timeout: float,
    session: str | None,
    system: str | None,
    verbose: bool,
    announce_resume: bool,
) -> Iterator[tuple[ChatEngine, Conversation, Diagnostics]]:
    """Lock the session (first, so a busy session fails before a model loads), then open
    the engine; both are released in reverse order, whatever happens."""
    from ..chat.archive import SessionStore
    from ..chat.local import LocalEngine
    from ..chat.native import native_providers
    from ..chat.remote import RemoteEngine, check_server_url
    from ..chat.render import Diagnostics
    from ..chat.session import Conversation
    from ..config import werk_home

    diagnostics = Diagnostics(verbose)
    diagnostics.route_logs()
    key: str | None = None
    if server is not None:
        try:
            check_server_url(server)
        except InvalidRequest as exc:
            raise typer.BadParameter(exc.message, param_hint="--server") from None
        if api_key_file is not None:
            from .runtime._common import read_key_file

            key = read_key_file(api_key_file)
    home = werk_home()
    with contextlib.ExitStack() as stack:
        archive = None
        if session is not None:
            archive = stack.enter_context(
                SessionStore(home).open(session, model=model, system=system)
            )
            count = len(archive.messages)
            where = f"session {session}"
            if archive.resumed:
                text = f"resumed {where}: {count} message(s) of model {model}"
                (diagnostics.note if announce_resume else diagnostics.phase)(text)
            else:
                diagnostics.phase(f"new {where} in {archive.path}")
            if archive.system_replaced:
                diagnostics.note(f"{where}: the system prompt was replaced by --system")
        engine: ChatEngine
        if server is not None:
            engine = stack.enter_context(
                RemoteEngine(
                    server,
                    api_key=key,
                    timeout=timeout,
                    phase=diagnostics.phase,
                    persist=session is not None,
                )
            )
        else:
            engine = stack.enter_context(
                LocalEngine(
                    home,
                    model,
                    phase=diagnostics.phase,
                    archive=archive,
                    providers=native_providers(),
                )
            )
        conversation = Conversation(model, system=system, archive=archive)
        yield engine, conversation, diagnostics


@app.command()
def run(
    model: ModelArg,
    prompt: Annotated[
        str | None,
        typer.Argument(metavar="PROMPT", help="The prompt; absent or '-' reads stdin."),
    ] = None,
    server: ServerOpt = None,
    api_key_file: KeyFileOpt = None,
    session: SessionOpt = None,
    persistence: PersistenceOpt = False,
    system: SystemOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = None,
    timeout: TimeoutOpt = 300.0,
    verbose: VerboseOpt = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="Print the final OpenAI chat.completion object instead."),
    ] = False,
) -> None:
    """Answer one prompt, streaming the reply to stdout as it arrives.

    The model runs in this process (started now, stopped at exit) unless --server names a
    running `werk serve`. With --session/--persistence the prompt continues that saved
    conversation and the turn is added to it.
    """
    from ..chat.render import ReplyPrinter, WaitIndicator
    from ..chat.session import Sampling, run_turn
    from ..chat.signals import terminate_on_signals

    text = read_prompt(prompt)
    name = _session_name(model, session, persistence)
    sampling = Sampling(temperature=temperature, seed=seed, max_tokens=max_tokens)
    printer = ReplyPrinter()
    waiting = WaitIndicator()

    def show(piece: str) -> None:
        waiting.stop()
        printer.write(piece)

    with _reporting(as_json), terminate_on_signals():
        try:
            with _conversation_and_engine(
                model=model,
                server=server,
                api_key_file=api_key_file,
                timeout=timeout,
                session=name,
                system=system,
                verbose=verbose,
                announce_resume=False,
            ) as (engine, conversation, diagnostics):
                if not as_json and not verbose:
                    waiting.start("waiting for the first token…")
                result = run_turn(
                    engine,
                    conversation,
                    text,
                    sampling=sampling,
                    on_text=(lambda _: None) if as_json else show,
                    phase=diagnostics.phase,
                )
        finally:
            waiting.stop()
            printer.end()
    if as_json:
        emit_json(result.response)


@app.command()
def chat(
    model: ModelArg,
    server: ServerOpt = None,
    api_key_file: KeyFileOpt = None,
    session: SessionOpt = None,
    persistence: PersistenceOpt = False,
    system: SystemOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = None,
    timeout: TimeoutOpt = 300.0,
    verbose: VerboseOpt = False,
) -> None:
    """Chat interactively: /exit or Ctrl+D quits, /reset forgets, Ctrl+C cancels a reply.

    Replies stream as they arrive. The model runs in this process until the chat ends unless
    --server names a running `werk serve`. With --session/--persistence the conversation is
    saved after every completed turn and resumed next time.
    """
    from ..chat.render import ReplyPrinter
    from ..chat.repl import repl
    from ..chat.session import Sampling
    from ..chat.signals import terminate_on_signals

    name = _session_name(model, session, persistence)
    sampling = Sampling(temperature=temperature, seed=seed, max_tokens=max_tokens)
    printer = ReplyPrinter()
    with _reporting(False), terminate_on_signals():
        try:
            with _conversation_and_engine(
                model=model,
                server=server,
                api_key_file=api_key_file,
                timeout=timeout,
                session=name,
                system=system,
                verbose=verbose,
                announce_resume=True,
            ) as (engine, conversation, diagnostics):
                repl(
                    engine,
                    conversation,
                    sampling=sampling,
                    diagnostics=diagnostics,
                    printer=printer,
                    interactive=sys.stdin.isatty(),
                )
        finally:
            printer.end()
