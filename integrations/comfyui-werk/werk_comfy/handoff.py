"""The value on a ``WERK_STATE_HANDOFF`` socket: a single-use prefill handoff, kept private.

ComfyUI links sockets by their type string, so a ``WERK_STATE_HANDOFF`` output reaches only a
``WERK_STATE_HANDOFF`` input (or an input of type ``*``, such as the core "Preview Any" node,
which writes ``json.dumps(value)`` or else ``str(value)`` into ``/history``). The token inside
is therefore never reachable as text: ``str``/``repr`` show the model and the expiry only,
``json.dumps`` refuses the object (it is neither a ``str`` nor a ``dict``), and pickling and
copying are refused. :meth:`WerkStateHandoff.spend` hands the token out exactly once, to the
decode request; a second decode of the same value fails in the node, before any request.
"""

from __future__ import annotations

import threading
from typing import Any, NoReturn

from .client import WerkNodeError

__all__ = ["HANDOFF_TYPE", "WerkStateHandoff"]

HANDOFF_TYPE = "WERK_STATE_HANDOFF"


class WerkStateHandoff:
    """A handoff minted by a prefill: the token (hidden), its model, its expiry and the named
    state it belongs to (when one was kept)."""

    __slots__ = ("__token", "_lock", "expires_at", "model", "server", "state_id")

    def __init__(
        self, token: str, *, model: str, expires_at: str, server: Any, state_id: str | None
    ) -> None:
        self.__token: str | None = token
        self._lock = threading.Lock()
        self.model = model
        self.expires_at = expires_at
        self.server = server
        self.state_id = state_id

    @property
    def spent(self) -> bool:
        return self.__token is None

    def spend(self) -> str:
        """The token, once; afterwards :class:`WerkNodeError` ``invalid_handoff`` (a handoff is
        single-use, also after a failed decode: run the prefill again)."""
        with self._lock:
            token, self.__token = self.__token, None
        if token is None:
            raise WerkNodeError(
                "invalid_handoff",
                "this handoff was already used by a decode; a handoff is single-use: run the "
                "prefill again (Werk Prefill re-runs on every queue)",
                410,
            )
        return token

    def __str__(self) -> str:
        state = f", state {self.state_id}" if self.state_id else ""
        used = "used" if self.spent else f"expires {self.expires_at}"
        return f"<Werk handoff for {self.model}{state}, {used}; token hidden>"

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def _refuse(self, *_: Any) -> NoReturn:
        raise TypeError("a Werk handoff is private: it cannot be copied or serialised")

    __reduce__ = __reduce_ex__ = __copy__ = __deepcopy__ = __getstate__ = _refuse
