"""A separately operated vLLM OpenAI endpoint (backend ``vllm-remote``).

Configured by environment: ``WERK_VLLM_HOST`` and ``WERK_VLLM_PORT`` (both, or no endpoint),
optional ``WERK_VLLM_API_KEY`` (sent as a bearer token), optional ``WERK_VLLM_MODEL`` (the
endpoint's model to use; without it the endpoint must list exactly one), and
``WERK_VLLM_REMOTE_SALT=0`` to stop Werk adding its per-principal ``cache_salt`` (on by
default: the endpoint's prefix cache is shared by everyone who reaches it).

Werk starts nothing: a runtime of this backend is a client for the endpoint, and its lifetime
is the endpoint's. No process argument is ever generated, so a non-empty ``WERK_VLLM_ARGS``
next to an endpoint is a configuration error. Models are imported without files:
``werk models import --backend vllm-remote --id ID``.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass

import httpx

from werk import (
    CapabilityId,
    InvalidRequest,
    LoopbackClient,
    LoopbackError,
    ModelSpec,
    NotFound,
    Runtime,
    Unavailable,
)

__all__ = [
    "Endpoint",
    "RemoteHandle",
    "configured",
    "endpoint_answers",
    "start_remote",
    "stop_remote",
]

HOST_ENV, PORT_ENV = "WERK_VLLM_HOST", "WERK_VLLM_PORT"
KEY_ENV, MODEL_ENV, SALT_ENV = "WERK_VLLM_API_KEY", "WERK_VLLM_MODEL", "WERK_VLLM_REMOTE_SALT"
ARGS_ENV = "WERK_VLLM_ARGS"
HEALTH_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class Endpoint:
    """The configured endpoint (the API key is never shown)."""

    base_url: str
    host: str
    port: int
    api_key: str | None
    model: str | None
    salt: bool

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def configured() -> Endpoint | None:
    """The endpoint from the environment, ``None`` when none is configured.

    :raises werk.InvalidRequest: half a configuration, a bad port, or ``WERK_VLLM_ARGS`` set
        next to an endpoint (a remote server gets no process arguments).
    """
    host, port = os.environ.get(HOST_ENV, ""), os.environ.get(PORT_ENV, "")
    if not host and not port:
        return None
    if not host or not port:
        raise InvalidRequest(f"set both {HOST_ENV} and {PORT_ENV} for a remote vLLM, or neither")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidRequest(f"{PORT_ENV}={port!r} is not a TCP port")
    if os.environ.get(ARGS_ENV, "").strip():
        raise InvalidRequest(
            f"{ARGS_ENV} is set but {HOST_ENV}/{PORT_ENV} name a remote vLLM: Werk starts no "
            "process for it, so its arguments would be ignored; unset one of them"
        )
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return Endpoint(
        base_url=f"http://{bracketed}:{int(port)}",
        host=host,
        port=int(port),
        api_key=os.environ.get(KEY_ENV) or None,
        model=os.environ.get(MODEL_ENV) or None,
        salt=os.environ.get(SALT_ENV, "1") != "0",
    )


def endpoint_answers(endpoint: Endpoint) -> bool:
    """``GET /health`` answers 200 now (synchronous: capability discovery runs in a thread)."""
    try:
        with httpx.Client(trust_env=False, timeout=HEALTH_TIMEOUT_SECONDS) as http:
            return http.get(endpoint.base_url + "/health").status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(eq=False)
class RemoteHandle:
    """A runtime of ``vllm-remote``: a client for the endpoint (pooled keep-alive
    connections, the API key set) and the model it serves."""

    endpoint: Endpoint
    http: LoopbackClient
    served_model: str


def _choose(listed: list[str], wanted: str | None, where: str) -> str:
    if wanted is not None:
        if wanted not in listed:
            raise NotFound(
                f"{MODEL_ENV}={wanted!r} is not served by the remote vLLM at {where} "
                f"(it lists: {', '.join(listed) or 'nothing'})"
            )
        return wanted
    if len(listed) == 1:
        return listed[0]
    raise InvalidRequest(
        f"the remote vLLM at {where} serves {len(listed)} models "
        f"({', '.join(listed) or 'none'}); set {MODEL_ENV} to choose one"
    )


async def start_remote(spec: ModelSpec) -> Runtime:
    """``BackendDescriptor.start``: connect (no process), check health, pick the model."""
    endpoint = configured()
    if endpoint is None:
        raise Unavailable(
            f"no remote vLLM endpoint is configured: set {HOST_ENV} and {PORT_ENV}",
            capability=CapabilityId.MODEL_RESIDENCY,
            retryable=False,
        )
    http = LoopbackClient(endpoint.host, endpoint.port, headers=endpoint.headers())
    try:
        try:
            healthy = (await http.fetch("GET", "/health", timeout=HEALTH_TIMEOUT_SECONDS))[0]
            models = await http.fetch("GET", "/v1/models", timeout=10.0) if healthy == 200 else None
        except LoopbackError:
            healthy, models = 0, None
        if healthy != 200:
            raise Unavailable(
                f"the remote vLLM at {endpoint.base_url} does not answer /health",
                capability=CapabilityId.MODEL_RESIDENCY,
            )
        if models is None or models[0] != 200:
            refused = models is not None and models[0] == 401
            why = "refused the API key (WERK_VLLM_API_KEY)" if refused else "did not list models"
            raise Unavailable(
                f"the remote vLLM at {endpoint.base_url} {why}",
                capability=CapabilityId.MODEL_RESIDENCY,
                retryable=False,
            )
        try:
            listing = json.loads(models[1])
        except ValueError:
            listing = None
        data = (listing.get("data") if isinstance(listing, dict) else None) or []
        listed = [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")]
        served = _choose(listed, endpoint.model, endpoint.base_url)
    except BaseException:
        await http.aclose()
        raise
    handle = RemoteHandle(endpoint=endpoint, http=http, served_model=served)
    return Runtime(
        backend=spec.backend, model=spec, generation="g_" + secrets.token_hex(8), handle=handle
    )


async def stop_remote(runtime: Runtime) -> None:
    """``BackendDescriptor.stop``: drop the client; the endpoint itself is never touched."""
    runtime.alive = False
    handle = runtime.handle
    if isinstance(handle, RemoteHandle):
        await handle.http.aclose()
