"""``werk runtime prefill`` and ``werk runtime decode``: the single-use handoff round trip.

``prefill`` prints the handoff token as the only line on stdout (the summary goes to stderr),
so ``TOKEN=$(werk runtime prefill …)`` followed by ``werk runtime decode "$TOKEN"`` works.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ...protocol import (
    DecodeRequest,
    DecodeResponse,
    InvalidRequest,
    PayloadTooLarge,
    Policy,
    PrefillRequest,
    PrefillResponse,
    Retention,
    Reuse,
)
from ...protocol.policy import TTL_MAX_SECONDS, TTL_MIN_SECONDS
from ...protocol.prefill import MAX_DECODE_TOKENS, MAX_PROMPT_CHARS
from ._common import (
    DEFAULT_SERVER,
    DEFAULT_TIMEOUT,
    Connection,
    JsonOpt,
    KeyFileOpt,
    ServerOpt,
    TimeoutOpt,
    model_option,
    read_bounded,
    respond,
)
from ._render import console, show, size, table

if TYPE_CHECKING:
    import msgspec

    from ...client import WerkClient

__all__ = ["build_prefill", "decode", "prefill", "read_prompt"]

MAX_PROMPT_BYTES = 4 * MAX_PROMPT_CHARS  # UTF-8 needs at most four bytes per character


# -- prefill ---------------------------------------------------------------------------------


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
    return _decode_prompt(read_bounded(file, MAX_PROMPT_BYTES, "--file"), str(file))


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
    import msgspec

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


def prefill(
    model: Annotated[str, model_option("The model id.")],
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

    def call(client: WerkClient) -> PrefillResponse:
        # The prompt is read once connected, so a bad --server is reported before stdin is read.
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
            return client.prefill(request)

    respond(Connection(server, api_key_file, timeout), as_json, call, _print_prefill)


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


# -- decode ----------------------------------------------------------------------------------


def _read_handoff(handoff: str) -> str:
    if handoff != "-":
        return handoff
    token = sys.stdin.read(1024).strip()
    if not token:
        raise typer.BadParameter("- given but stdin was empty", param_hint="'HANDOFF'")
    return token


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

    def call(client: WerkClient) -> DecodeResponse:
        request = DecodeRequest(
            handoff=_read_handoff(handoff),
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=list(stop or []),
        )
        with _busy("decoding"):
            return client.decode(request)

    respond(Connection(server, api_key_file, timeout), as_json, call, _print_decode)


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
