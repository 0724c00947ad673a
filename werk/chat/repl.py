"""The ``werk chat`` read-eval-print loop.

Lines are read with :func:`input`, which uses GNU readline (line editing, in-memory history with
the arrow keys) when stdin and stdout are a terminal. Commands start with ``/``: ``/exit`` (also
``/quit``) leaves, ``/reset`` forgets the conversation (and empties the archive), ``/help``.
Ctrl+D at the prompt leaves; Ctrl+C at the prompt discards the line; Ctrl+C while a reply streams
cancels that reply (the stream is closed, the turn is not kept) and the session goes on. A
failed turn is reported and the session goes on too. SIGTERM/SIGHUP are not handled here: they
end the loop by exception so the caller's cleanup runs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import WerkError
from .render import Diagnostics, ReplyPrinter
from .session import ChatEngine, Conversation, Sampling, run_turn

__all__ = ["HELP", "PROMPT", "repl"]

PROMPT = ">>> "
HELP = "/exit or Ctrl+D quits, /reset forgets the conversation, Ctrl+C cancels a reply"
_EXIT = frozenset({"/exit", "/quit", "/bye"})


def repl(
    engine: ChatEngine,
    conversation: Conversation,
    *,
    sampling: Sampling,
    diagnostics: Diagnostics,
    printer: ReplyPrinter,
    interactive: bool,
    read_line: Callable[[str], str] = input,
) -> None:
    """Run the loop until /exit or end of input. ``interactive`` shows prompts and enables
    readline editing."""
    if interactive:
        import readline  # noqa: F401  (imported for its side effect: input() gains editing)

        diagnostics.note(HELP)
    prompt = PROMPT if interactive else ""
    while True:
        try:
            line = read_line(prompt)
        except EOFError:
            if interactive:
                printer.stream.write("\n")
                printer.stream.flush()
            return
        except KeyboardInterrupt:
            printer.stream.write("\n")
            printer.stream.flush()
            continue
        text = line.strip()
        if not text:
            continue
        if text.startswith("/"):
            command = text.split()[0].lower()
            if command in _EXIT:
                return
            if command == "/reset":
                conversation.reset()
                diagnostics.note("conversation reset")
            elif command in ("/help", "/?"):
                diagnostics.note(HELP)
            else:
                diagnostics.note(f"unknown command {command}; {HELP}")
            continue
        try:
            run_turn(
                engine,
                conversation,
                text,
                sampling=sampling,
                on_text=printer.write,
                phase=diagnostics.phase,
            )
        except KeyboardInterrupt:
            printer.end()
            diagnostics.note("reply cancelled; the turn was not kept")
            continue
        except WerkError as exc:
            printer.end()
            diagnostics.note(f"error: {exc.message} ({exc.code}); the turn was not kept")
            continue
        printer.end()
