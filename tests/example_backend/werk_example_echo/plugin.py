"""Hook implementations of the example ``echo`` backend.

This is the smallest useful Werk plugin, written the way a third-party author would write one:
it imports only public names from :mod:`werk` and implements three hooks.

* :func:`werk_register_backends` registers the backend ``echo``.
* :func:`werk_capabilities` reports its rows truthfully: ``runtime.pd.prefill`` is
  ``experimental`` (it works, but it evaluates no model) and the plugin-specific id
  ``echo.reverse`` (``<backend>.<name>``) is ``supported``.
* :func:`werk_prefill` returns the prompt's UTF-8 bytes as an opaque ``bytes`` state.

Everything else (decode, snapshot, restore, expert moves) is deliberately not implemented. The
host then answers those operations with :class:`werk.Unsupported` naming the capability; a
plugin never has to write "not supported" stubs.

The backend registers no ``start`` coroutine, so the host cannot start ``echo`` runtimes itself;
callers that embed Werk build a :class:`werk.Runtime` for it directly.
"""

from __future__ import annotations

from collections.abc import Callable

from werk import (
    BackendDescriptor,
    BackendState,
    CapabilityContext,
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    StateKind,
    hookimpl,
)

__all__ = ["BACKEND", "reverse", "werk_capabilities", "werk_prefill", "werk_register_backends"]

BACKEND = "echo"
"""The backend name; it also prefixes this plugin's own capability ids."""

REVERSE_CAPABILITY = f"{BACKEND}.reverse"


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    """Offer one backend, ``echo``, serving plain text."""
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("text",),
            description="example backend: a prompt's state is the prompt's own bytes",
        )
    )


@hookimpl
def werk_capabilities(context: CapabilityContext) -> list[CapabilityReport]:
    """The same two rows for every model: echo needs no process, so nothing can be missing.

    Rows leave ``backend`` and ``model`` empty; the host fills them from ``context``.
    """
    return [
        CapabilityReport(
            id=CapabilityId.PD_PREFILL,
            status=CapabilityStatus.EXPERIMENTAL,
            operations=["prefill"],
            reason="example backend: prefill echoes the prompt's bytes; no model is evaluated",
        ),
        CapabilityReport(
            id=REVERSE_CAPABILITY, status=CapabilityStatus.SUPPORTED, operations=["reverse"]
        ),
    ]


def _prompt_bytes(call: PrefillCall) -> bytes:
    if call.prompt is not None:
        return call.prompt.encode("utf-8")
    return "\n".join(message.content for message in call.messages or ()).encode("utf-8")


@hookimpl
def werk_prefill(runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
    """Return the prompt's UTF-8 bytes as the state; one "token" per byte.

    ``messages`` are joined with newlines. The state is bound to ``runtime.generation`` like
    every backend state.
    """
    data = _prompt_bytes(call)
    state = BackendState(
        kind=StateKind.BYTES,
        data=data,
        generation=runtime.generation,
        logical_bytes=len(data),
        tokens=len(data),
    )
    return PrefillOutcome(state=state, prompt_tokens=len(data))


def reverse(state: BackendState) -> BackendState:
    """The plugin-specific operation behind ``echo.reverse``: the state's bytes, reversed.

    The host does not dispatch plugin-specific operations; a caller imports this function. It
    shows how a plugin names its own capability without touching the ``runtime.`` namespace.

    :raises ValueError: ``state`` is not a ``bytes`` state.
    """
    if state.kind != StateKind.BYTES or state.data is None:
        raise ValueError(f"echo.reverse needs a bytes state, not a {state.kind} state")
    return BackendState(
        kind=StateKind.BYTES,
        data=state.data[::-1],
        generation=state.generation,
        logical_bytes=len(state.data),
        tokens=state.tokens,
    )
