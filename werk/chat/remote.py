"""The ``--server`` route: chat through a running ``werk serve``'s ``/v1/chat/completions``.

The server keeps its live runtime (and whatever prefix cache the backend holds in it) across
invocations, so ``werk run --server URL`` neither starts a worker nor restores anything; the
conversation archive stays on the client and the whole history is sent with every turn. With
``--persistence``/``--session`` each turn also asks the server to keep the conversation as a
named state (``persist``): the next turn, even after a server restart, continues from it and
evaluates only what is new; the server proves that with its own counters.

Transport rules match the bundled client (:mod:`werk.client`): plain ``http://host[:port]``
only, redirects are never followed, proxies from the environment are ignored, the key comes from
the caller (``--api-key-file``) or ``$WERK_API_KEY``, and every body is bounded: an error body
by :data:`MAX_ERROR_BYTES`, the event stream by :mod:`werk.chat.sse`. Closing the chunk
iterator early closes the connection, which cancels the reply on the server.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..protocol import (
    BackendError,
    InvalidRequest,
    PayloadTooLarge,
    Unavailable,
    WerkError,
    WerkTimeout,
)
from .native import TurnOutcome
from .sse import sse_data
from .stream import error_from_body

__all__ = ["API_KEY_ENV", "MAX_ERROR_BYTES", "RemoteEngine", "check_server_url"]

API_KEY_ENV = "WERK_API_KEY"
MAX_ERROR_BYTES = 1024 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
ROUTE = "/v1/chat/completions"
_NOT_PERSISTABLE = frozenset(
    {"unsupported", "unavailable", "experimental_opt_in_required", "invalid_request"}
)
"""A persisted turn refused for these reasons is asked again without ``werk.persist``."""


def check_server_url(server: str) -> str:
    """``http://host[:port]`` without path, query, fragment or credentials.

    :raises werk.InvalidRequest: anything else.
    """
    parts = urlsplit(server)
    if (
        parts.scheme != "http"
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise InvalidRequest(f"server must be http://host[:port], got {server!r}")
    return server.rstrip("/")


class RemoteEngine:
    """Chat requests to one ``werk serve`` (use it as a context manager or call :meth:`close`).

    :param server: ``http://host[:port]``.
    :param api_key: bearer key; ``None`` reads ``$WERK_API_KEY``.
    :param timeout: seconds for connect, and for each read while the reply streams.
    :param phase: prints a ``-v`` phase line.
    :param persist: ask the server to keep each turn as a named state and continue the next
        turn from it (``"werk": {"persist": true}``, :mod:`werk.control.chat_states`); a server
        or model that cannot is asked without it for the rest of the session (said on ``-v``).
    """

    def __init__(
        self,
        server: str,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        phase: Callable[[str], None] = lambda _: None,
        transport: httpx.BaseTransport | None = None,
        persist: bool = False,
    ) -> None:
        self.server = check_server_url(server)
        self._persist = persist
        self.label = f"werk serve at {self.server}"
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._phase = phase
        self._http = httpx.Client(
            base_url=self.server,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )
        phase(f"server {self.server}: its live runtime answers; no local worker is started")
        phase("cache capability probe: skipped; reuse checked on actual requests")

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def finished(self, outcome: TurnOutcome) -> None:
        """Nothing to do: the server owns its runtime and caches."""

    def stream(self, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        """POST ``body`` (streaming) and yield the chunk objects of the reply."""
        if not self._persist:
            yield from self._stream(body)
            return
        persisted = {k: v for k, v in body.items() if k != "stream_options"}
        persisted["werk"] = {"persist": True, "allow_experimental": True}
        chunks = self._stream(persisted)
        try:  # a refusal comes before the first chunk: ask again without keeping states
            first = next(chunks, None)
        except WerkError as exc:
            if exc.code.value not in _NOT_PERSISTABLE:
                raise
            self._persist = False
            self._phase(
                f"the server does not keep this chat's states ({exc.message}); asking without"
            )
            yield from self._stream(body)
            return
        for chunk in itertools.chain([first] if first is not None else [], chunks):
            state = chunk.get("werk")
            if isinstance(state, dict):
                reuse = state.get("reuse") or {}
                self._phase(
                    f"server state {state.get('state_id')}: reuse {reuse.get('outcome')}"
                    f" ({reuse.get('match') or 'no match'}), evaluated "
                    f"{state.get('evaluated_tokens')} token(s)"
                )
            yield chunk

    def _stream(self, body: dict[str, Any]) -> Generator[dict[str, Any], None, None]:
        content = json.dumps(body, ensure_ascii=False).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        try:
            with self._http.stream("POST", ROUTE, content=content, headers=headers) as response:
                if response.status_code != 200:
                    raise _error(response)
                kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if kind == "application/json":  # a server that answered without streaming
                    yield _object(_read_bounded(response, MAX_BODY_BYTES))
                    return
                if kind != "text/event-stream":
                    raise Unavailable(f"the server answered {kind or 'no content type'}, not SSE")
                for data in sse_data(response.iter_bytes()):
                    if data == b"[DONE]":
                        return
                    yield _object(data)
                raise Unavailable("the server closed the stream before it was complete")
        except httpx.TimeoutException:
            raise WerkTimeout(f"{self.server} did not answer in time") from None
        except httpx.TransportError as exc:
            raise Unavailable(
                f"cannot reach werk serve at {self.server} ({type(exc).__name__}); is it running?"
            ) from None


def _read_bounded(response: httpx.Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the server's response is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _error(response: httpx.Response) -> WerkError:
    status = response.status_code
    if 300 <= status < 400:
        return InvalidRequest(f"the server answered a redirect ({status}); not followed")
    try:
        body = json.loads(_read_bounded(response, MAX_ERROR_BYTES))
    except PayloadTooLarge:
        raise
    except ValueError:
        return Unavailable(f"the server answered HTTP {status} without an error body")
    return error_from_body(body, f"the server answered HTTP {status}")


def _object(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise BackendError("the server streamed an event that is not JSON") from None
    if not isinstance(obj, dict):
        raise BackendError("the server streamed an event that is not a JSON object")
    return obj
