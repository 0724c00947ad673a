"""The bundled Werk client: typed, bounded access to a running ``werk serve``.

Loopback-oriented by design: plain ``http://`` only (no TLS termination), redirects are never
followed, every response body is read up to a bound, and every call has a timeout. Error bodies
are turned back into the same :class:`werk.WerkError` subclasses the server raised.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

import httpx
import msgspec

from .protocol import (
    CapabilitiesResponse,
    DecodeRequest,
    DecodeResponse,
    ErrorBody,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    InfoResponse,
    InvalidRequest,
    JobRecord,
    MemoryResponse,
    ModelList,
    PayloadTooLarge,
    PinRequest,
    PinResult,
    PrefillRequest,
    PrefillResponse,
    PruneRequest,
    PruneResult,
    ResidencyRequest,
    ResidencyResult,
    RuntimeList,
    StateList,
    StateSummary,
    StatsResponse,
    Tier,
    TierRequest,
    TierResult,
    Unavailable,
    WerkError,
    WerkTimeout,
    encode,
    error_class,
)

__all__ = ["DEFAULT_SERVER", "MAX_RESPONSE_BYTES", "WerkClient"]

DEFAULT_SERVER = "http://127.0.0.1:11434"
API_KEY_ENV = "WERK_API_KEY"
MAX_RESPONSE_BYTES = 16 * 1024 * 1024

_T = TypeVar("_T")


class WerkClient:
    """Synchronous client for ``/werk/v1``.

    :param server: base URL, ``http://host:port`` (default ``http://127.0.0.1:11434``).
    :param api_key: bearer key; defaults to ``$WERK_API_KEY``.
    :param timeout: seconds for connect/read/write (prefill of a long prompt may need more).
    :param max_response_bytes: a larger response body is refused with ``payload_too_large``.
    """

    def __init__(
        self,
        server: str = DEFAULT_SERVER,
        *,
        api_key: str | None = None,
        timeout: float = 300.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
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
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._limit = max_response_bytes
        self._http = httpx.Client(
            base_url=server.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            follow_redirects=False,
            trust_env=False,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    def _call(
        self,
        method: Literal["GET", "POST"],
        path: str,
        response_type: type[_T],
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
    ) -> _T:
        content = encode(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            with self._http.stream(
                method, path, content=content, headers=headers, params=params
            ) as response:
                data = self._read_bounded(response)
                status = response.status_code
        except httpx.TimeoutException:
            raise WerkTimeout(f"the server did not answer {method} {path} in time") from None
        except httpx.TransportError as exc:
            raise Unavailable(f"cannot reach the Werk server: {type(exc).__name__}") from None
        if status >= 300:
            raise self._error(status, data)
        try:
            return msgspec.json.decode(data, type=response_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Unavailable(f"the server sent an unexpected response: {exc}") from None

    def _read_bounded(self, response: httpx.Response) -> bytes:
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > self._limit:
                raise PayloadTooLarge(f"response body over {self._limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @staticmethod
    def _error(status: int, data: bytes) -> WerkError:
        try:
            detail = msgspec.json.decode(data, type=ErrorBody).error
        except (msgspec.DecodeError, msgspec.ValidationError):
            if 300 <= status < 400:
                return InvalidRequest(f"the server answered a redirect ({status}); not followed")
            return Unavailable(f"the server answered HTTP {status} without a Werk error body")
        err = error_class(detail.code)(
            detail.message, capability=detail.capability, retryable=detail.retryable
        )
        err.request_id = detail.request_id
        return err

    # -- operations (mirroring WerkControl) ------------------------------------------------

    def info(self) -> InfoResponse:
        return self._call("GET", "/werk/v1/info", InfoResponse)

    def capabilities(self, *, model: str | None = None) -> CapabilitiesResponse:
        params = {"model": model} if model else None
        return self._call("GET", "/werk/v1/capabilities", CapabilitiesResponse, params=params)

    def memory(self) -> MemoryResponse:
        return self._call("GET", "/werk/v1/memory", MemoryResponse)

    def models(self) -> ModelList:
        return self._call("GET", "/werk/v1/models", ModelList)

    def runtimes(self) -> RuntimeList:
        return self._call("GET", "/werk/v1/runtimes", RuntimeList)

    def stats(self) -> StatsResponse:
        """The caller's verified-reuse figures (``GET /werk/v1/stats``)."""
        return self._call("GET", "/werk/v1/stats", StatsResponse)

    def set_residency(
        self, model: str, *, resident: bool, dry_run: bool = False
    ) -> ResidencyResult:
        action = "load" if resident else "unload"
        return self._call(
            "POST",
            f"/werk/v1/models/{_segment(model)}/{action}",
            ResidencyResult,
            body=ResidencyRequest(dry_run=dry_run),
        )

    def list_states(
        self, *, model: str | None = None, tier: Tier | None = None, pinned: bool | None = None
    ) -> StateList:
        params = {}
        if model is not None:
            params["model"] = model
        if tier is not None:
            params["tier"] = tier.value
        if pinned is not None:
            params["pinned"] = "true" if pinned else "false"
        return self._call("GET", "/werk/v1/states", StateList, params=params or None)

    def inspect_state(self, state_id: str) -> StateSummary:
        return self._call("GET", f"/werk/v1/states/{_segment(state_id)}", StateSummary)

    def prune_states(self, request: PruneRequest) -> PruneResult:
        return self._call("POST", "/werk/v1/states/prune", PruneResult, body=request)

    def pin_state(self, state_id: str, request: PinRequest) -> PinResult:
        path = f"/werk/v1/states/{_segment(state_id)}/pin"
        return self._call("POST", path, PinResult, body=request)

    def tier_state(self, state_id: str, request: TierRequest) -> TierResult:
        path = f"/werk/v1/states/{_segment(state_id)}/tier"
        return self._call("POST", path, TierResult, body=request)

    def prefill(self, request: PrefillRequest) -> PrefillResponse:
        return self._call("POST", "/werk/v1/prefill", PrefillResponse, body=request)

    def decode(self, request: DecodeRequest) -> DecodeResponse:
        return self._call("POST", "/werk/v1/decode", DecodeResponse, body=request)

    def experts(self, model: str) -> ExpertList:
        return self._call("GET", "/werk/v1/experts", ExpertList, params={"model": model})

    def expert_action(
        self, model: str, action: Literal["prefetch", "evict"], request: ExpertActionRequest
    ) -> ExpertActionResult:
        path = f"/werk/v1/experts/{_segment(model)}/{action}"
        return self._call("POST", path, ExpertActionResult, body=request)

    def job(self, job_id: str) -> JobRecord:
        return self._call("GET", f"/werk/v1/jobs/{_segment(job_id)}", JobRecord)


def _segment(value: str) -> str:
    """A single path segment; ids never contain separators, so refuse rather than escape."""
    if not value or any(c in value for c in "/?#%\\") or value in (".", ".."):
        raise InvalidRequest(f"{value!r} is not a valid identifier")
    return value
