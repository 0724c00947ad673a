"""The ``/werk/v1`` routes: authenticate, decode a bounded body, call ``WerkControl``, encode.

Every handler is built by :func:`endpoint`, so authentication, body bounds, unknown-query
rejection and error mapping are the same everywhere. The route table is data
(:data:`ROUTE_SPECS`) so tests and the OpenAPI document walk exactly what is served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..control.interface import StateQuery, WerkControl
from ..protocol import (
    CapabilitiesResponse,
    DecodeRequest,
    DecodeResponse,
    ExpertActionRequest,
    ExpertActionResult,
    ExpertList,
    InfoResponse,
    InvalidRequest,
    JobRecord,
    MemoryResponse,
    ModelList,
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
    encode,
)
from ..protocol.paging import decode_cursor, parse_limit
from ..protocol.prefill import ModelId
from .auth import Authenticator
from .errors import error_response
from .guard import admit
from .requests import read_struct

__all__ = ["ROUTE_SPECS", "RouteSpec", "werk_routes"]

SMALL_BODY = 64 * 1024
PROMPT_BODY = 32 * 1024 * 1024  # a 4 Mi-character prompt in 4-byte UTF-8 plus framing

Handler = Callable[["Call"], Awaitable[Any]]


class Call(msgspec.Struct, frozen=True):
    """What a handler receives: the service, the caller's principal and the request."""

    control: WerkControl
    principal: str
    request: Request

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])

    def query(self, *allowed: str) -> dict[str, str]:
        params = dict(self.request.query_params)
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise InvalidRequest(f"unknown query parameter(s): {', '.join(unknown)}")
        return params

    async def body(self, type: type[Any], limit: int = SMALL_BODY) -> Any:
        return await read_struct(self.request, type, limit)


class RouteSpec(msgspec.Struct, frozen=True):
    """One served route: method, path, request/response Structs, and whether auth applies."""

    method: str
    path: str
    handler: Handler
    summary: str
    response: type | None
    request: type | None = None
    authenticated: bool = True


def _bool_param(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    if value in ("true", "false"):
        return value == "true"
    raise InvalidRequest(f"query parameter {name!r} must be true or false")


def _model_param(value: str | None) -> str | None:
    """A ``model`` query parameter: a model id (1..128 characters) when present."""
    if value is None:
        return None
    try:
        return msgspec.convert(value, ModelId)
    except msgspec.ValidationError:
        raise InvalidRequest("query parameter 'model' must be 1 to 128 characters") from None


def _tier_param(value: str | None) -> Tier | None:
    if value is None:
        return None
    try:
        return Tier(value)
    except ValueError:
        raise InvalidRequest(f"unknown tier {value!r}") from None


# -- handlers ---------------------------------------------------------------------------------


async def _info(c: Call) -> InfoResponse:
    c.query()
    return await c.control.info()


async def _capabilities(c: Call) -> CapabilitiesResponse:
    q = c.query("model")
    return await c.control.capabilities(model=_model_param(q.get("model")))


async def _memory(c: Call) -> MemoryResponse:
    c.query()
    return await c.control.memory()


async def _runtimes(c: Call) -> RuntimeList:
    c.query()
    return await c.control.runtimes_listing()


async def _stats(c: Call) -> StatsResponse:
    c.query()
    return await c.control.stats(c.principal)


async def _models(c: Call) -> ModelList:
    c.query()
    return await c.control.models()


async def _load(c: Call) -> ResidencyResult:
    c.query()
    body = await c.body(ResidencyRequest)
    return await c.control.set_residency(c.path("model"), body, resident=True)


async def _unload(c: Call) -> ResidencyResult:
    c.query()
    body = await c.body(ResidencyRequest)
    return await c.control.set_residency(c.path("model"), body, resident=False)


async def _states(c: Call) -> StateList:
    q = c.query("model", "tier", "pinned", "limit", "cursor")
    query = StateQuery(
        model=_model_param(q.get("model")),
        tier=_tier_param(q.get("tier")),
        pinned=_bool_param(q.get("pinned"), "pinned"),
        limit=parse_limit(q.get("limit")),
        after=decode_cursor(q.get("cursor")),
    )
    return await c.control.list_states(c.principal, query)


async def _state(c: Call) -> StateSummary:
    c.query()
    return await c.control.inspect_state(c.principal, c.path("state_id"))


async def _prune(c: Call) -> PruneResult:
    c.query()
    return await c.control.prune_states(c.principal, await c.body(PruneRequest))


async def _pin(c: Call) -> PinResult:
    c.query()
    body = await c.body(PinRequest)
    return await c.control.pin_state(c.principal, c.path("state_id"), body)


async def _tier(c: Call) -> TierResult:
    c.query()
    body = await c.body(TierRequest)
    return await c.control.tier_state(c.principal, c.path("state_id"), body)


async def _prefill(c: Call) -> PrefillResponse:
    c.query()
    return await c.control.prefill(c.principal, await c.body(PrefillRequest, PROMPT_BODY))


async def _decode(c: Call) -> DecodeResponse:
    c.query()
    return await c.control.decode(c.principal, await c.body(DecodeRequest))


async def _experts(c: Call) -> ExpertList:
    q = c.query("model")
    model = _model_param(q.get("model"))
    if model is None:
        raise InvalidRequest("query parameter 'model' is required")
    return await c.control.experts(c.principal, model)


async def _prefetch(c: Call) -> ExpertActionResult:
    c.query()
    body = await c.body(ExpertActionRequest)
    return await c.control.expert_action(c.principal, c.path("model"), "prefetch", body)


async def _evict(c: Call) -> ExpertActionResult:
    c.query()
    body = await c.body(ExpertActionRequest)
    return await c.control.expert_action(c.principal, c.path("model"), "evict", body)


async def _job(c: Call) -> JobRecord:
    c.query()
    return await c.control.job(c.principal, c.path("job_id"))


async def _health(c: Call) -> dict[str, str]:
    c.query()
    return {"status": "ok"}


P = "/werk/v1"

ROUTE_SPECS: tuple[RouteSpec, ...] = (
    RouteSpec(
        "GET",
        f"{P}/health",
        _health,
        "Liveness probe (no authentication)",
        None,
        authenticated=False,
    ),
    RouteSpec("GET", f"{P}/info", _info, "Server, plugins, models and defaults", InfoResponse),
    RouteSpec("GET", f"{P}/capabilities", _capabilities, "Capability matrix", CapabilitiesResponse),
    RouteSpec("GET", f"{P}/memory", _memory, "Memory telemetry and accounting", MemoryResponse),
    RouteSpec("GET", f"{P}/models", _models, "Configured models and residency", ModelList),
    RouteSpec(
        "GET", f"{P}/runtimes", _runtimes, "Loaded runtimes and their keep-alive", RuntimeList
    ),
    RouteSpec("GET", f"{P}/stats", _stats, "The caller's verified-reuse figures", StatsResponse),
    RouteSpec(
        "POST",
        f"{P}/models/{{model}}/load",
        _load,
        "Make a model resident",
        ResidencyResult,
        ResidencyRequest,
    ),
    RouteSpec(
        "POST",
        f"{P}/models/{{model}}/unload",
        _unload,
        "Release a resident model",
        ResidencyResult,
        ResidencyRequest,
    ),
    RouteSpec("GET", f"{P}/states", _states, "The caller's states (read-only)", StateList),
    RouteSpec(
        "POST",
        f"{P}/states/prune",
        _prune,
        "Prune states (dry run by default)",
        PruneResult,
        PruneRequest,
    ),
    RouteSpec("GET", f"{P}/states/{{state_id}}", _state, "One state (read-only)", StateSummary),
    RouteSpec(
        "POST",
        f"{P}/states/{{state_id}}/pin",
        _pin,
        "Pin or unpin (dry run by default)",
        PinResult,
        PinRequest,
    ),
    RouteSpec(
        "POST",
        f"{P}/states/{{state_id}}/tier",
        _tier,
        "Move a state between tiers (dry run by default)",
        TierResult,
        TierRequest,
    ),
    RouteSpec(
        "POST",
        f"{P}/prefill",
        _prefill,
        "Evaluate a prompt; issue a decode handoff",
        PrefillResponse,
        PrefillRequest,
    ),
    RouteSpec(
        "POST",
        f"{P}/decode",
        _decode,
        "Consume a handoff and generate",
        DecodeResponse,
        DecodeRequest,
    ),
    RouteSpec("GET", f"{P}/experts", _experts, "Expert residency of a model", ExpertList),
    RouteSpec(
        "POST",
        f"{P}/experts/{{model}}/prefetch",
        _prefetch,
        "Plan or apply an expert prefetch",
        ExpertActionResult,
        ExpertActionRequest,
    ),
    RouteSpec(
        "POST",
        f"{P}/experts/{{model}}/evict",
        _evict,
        "Plan or apply an expert eviction",
        ExpertActionResult,
        ExpertActionRequest,
    ),
    RouteSpec("GET", f"{P}/jobs/{{job_id}}", _job, "One job record", JobRecord),
)


def endpoint(
    spec: RouteSpec, control: WerkControl, auth: Authenticator
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler with admission, encoding and the single error mapping."""

    async def run(request: Request) -> Response:
        try:
            principal = admit(request, auth) if spec.authenticated else "anonymous"
            result = await spec.handler(Call(control, principal, request))
            return Response(encode(result), 200, media_type="application/json")
        except Exception as exc:
            return error_response(request, exc)

    return run


def werk_routes(control: WerkControl, auth: Authenticator) -> list[Route]:
    return [Route(s.path, endpoint(s, control, auth), methods=[s.method]) for s in ROUTE_SPECS]
