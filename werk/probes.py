"""A functional probe of a backend's state hooks, run by the backend on its own runtime.

A capability row may say ``experimental`` only after a functional probe passed for *this*
process generation. For a backend with ``werk_prefill``/``werk_snapshot``/``werk_restore``/
``werk_decode`` the probe is always the same: keep a state, export it, import the export, and
check that the imported state continues exactly as the live one — and that a damaged export is
refused. :func:`probe_state_hooks` runs it with the backend's own hook functions, called
directly (not through the host), typically at the end of ``start``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from .backends import BackendState, DecodeCall, PrefillCall, Runtime, StateKind
from .plugins import await_me_maybe
from .protocol import WerkError

__all__ = ["StateProbe", "probe_state_hooks"]

Hook = Callable[..., Any | Awaitable[Any]]


class StateProbe(msgspec.Struct, frozen=True, kw_only=True):
    """What :func:`probe_state_hooks` found.

    :ivar passed: every step passed.
    :ivar reason: what was seen (a capability row's reason, whichever way it went).
    :ivar generation: the runtime generation it was run on; a probe proves only that one.
    """

    passed: bool
    reason: str
    generation: str


def _truncated(payload: BackendState) -> BackendState | None:
    if payload.kind is StateKind.BYTES and payload.data is not None:
        return msgspec.structs.replace(payload, data=payload.data[: len(payload.data) // 2])
    return None  # a file or connector payload: the backend owns where its copies may live


async def probe_state_hooks(
    runtime: Runtime,
    *,
    prefill: Hook,
    decode: Hook,
    snapshot: Hook,
    restore: Hook,
    erase: Hook | None = None,
    prompt: str = "probe",
    max_tokens: int = 3,
) -> StateProbe:
    """Prove the state hooks on ``runtime``; never raises for a failed step.

    Steps: ``prefill(runtime, PrefillCall(prompt, keep=True))`` keeps a live state;
    ``snapshot(runtime, state)`` exports it; ``erase(runtime, state)``, when given, drops the
    live state's backing (so the restore cannot find it still resident); ``restore(runtime,
    export)`` imports it; ``decode`` continues both (``max_tokens``, greedy). Passes when the
    restored continuation equals the live one's and is not empty, and a ``bytes`` export cut in
    half is refused with a :class:`werk.WerkError`.

    Each hook may be a plain function or a coroutine function, with the hook's own signature
    (``werk_prefill(runtime, call)``, …); pass your hook implementations.
    """

    def result(passed: bool, reason: str) -> StateProbe:
        return StateProbe(passed=passed, reason=reason, generation=runtime.generation)

    step = "prefill"
    try:
        kept = await await_me_maybe(prefill(runtime, PrefillCall(prompt=prompt, keep=True)))
        live: BackendState = kept.state
        step = "decode of the live state"
        before = await await_me_maybe(
            decode(runtime, DecodeCall(state=live, max_tokens=max_tokens))
        )
        step = "prefill"
        kept = await await_me_maybe(prefill(runtime, PrefillCall(prompt=prompt, keep=True)))
        step = "snapshot"
        exported: BackendState = await await_me_maybe(snapshot(runtime, kept.state))
        if erase is not None:
            step = "erase"
            await await_me_maybe(erase(runtime, kept.state))
        step = "restore"
        restored: BackendState = await await_me_maybe(restore(runtime, exported))
        step = "decode of the restored state"
        after = await await_me_maybe(
            decode(runtime, DecodeCall(state=restored, max_tokens=max_tokens))
        )
    except Exception as exc:
        return result(False, f"the probe's {step} raised {type(exc).__name__}: {exc}")
    if not before.text or after.text != before.text:
        return result(
            False,
            f"a restored state continued with {after.text!r}, the live one with {before.text!r}",
        )
    broken = _truncated(exported)
    if broken is not None:
        try:
            await await_me_maybe(restore(runtime, broken))
            return result(False, "a snapshot cut in half was restored")
        except WerkError:
            pass
        except Exception as exc:
            return result(
                False, f"a damaged snapshot raised {type(exc).__name__}, not a werk.WerkError"
            )
    return result(True, f"a restored state continued with {after.text!r}")
