"""Every ``/werk/v1`` route and every reachable error code, against a real ``werk serve``.

Two servers serve the whole module (real subprocesses on loopback, the ``testkv`` test backend):

* ``local`` — unauthenticated local mode with several testkv models, so flows that kill a
  runtime (``victim``, ``crash``) or break the store never disturb another test's model;
* ``keyed`` — API-key mode with three keys, for ``401`` and the per-principal handoff bound.

Every response of the module passes :func:`_check_response` (an httpx response hook): it
carries a fresh ``X-Werk-Request-Id: req_…``, never contains the test backend's secret failure
text, and an error body names the same request id and the status of its code in the protocol's
error table.

Codes that no HTTP request can produce with this server are listed in
``test_unreachable_codes_are_not_raised_on_the_serving_path`` with the reason.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec
import pytest
from _server import OPENAI_ROUTES, WerkServer

from werk.http.openapi import openapi_document
from werk.http.routes import ROUTE_SPECS, SMALL_BODY
from werk.protocol import (
    HTTP_STATUS,
    CapabilitiesResponse,
    CapabilityStatus,
    DecodeResponse,
    ErrorBody,
    ErrorCode,
    ErrorDetail,
    InfoResponse,
    MemoryResponse,
    PinResult,
    PrefillResponse,
    PruneResult,
    ReuseOutcome,
    RuntimeList,
    StateList,
    StateSummary,
    StatsResponse,
    Tier,
)

REPO = Path(__file__).resolve().parents[2]
SECRET = "/testkv/secret/internal-failure-detail"
"""``werk_test_backend.FAILURE_DETAIL``: text of every simulated backend failure."""
REQUEST_ID = re.compile(r"^req_[0-9a-f]{16,64}$")
GENERATION = re.compile(r"g_[0-9a-f]{16}")
P = "/werk/v1"
_T = TypeVar("_T")
KEY_A, KEY_B, KEY_C = "routes-key-alpha-0001", "routes-key-bravo-0002", "routes-key-charlie-0003"
SpawnServer = Callable[..., WerkServer]

# A 405/415 answer keeps the code invalid_request with a more precise status (docs/protocol.md).
_STATUS_OVERRIDES = {405: ErrorCode.INVALID_REQUEST, 415: ErrorCode.INVALID_REQUEST}


# -- helpers ---------------------------------------------------------------------------------


def _check_response(seen: set[str]) -> Callable[[httpx.Response], None]:
    def check(response: httpx.Response) -> None:
        response.read()
        request_id = response.headers.get("x-werk-request-id", "")
        assert REQUEST_ID.fullmatch(request_id), (response.url, request_id)
        assert request_id not in seen, "a request id was reused"
        seen.add(request_id)
        assert SECRET not in response.text
        if response.status_code < 400:
            return
        if response.url.path.startswith("/v1/"):
            error = response.json()["error"]
            assert set(error) >= {"message", "type", "code"}
            return
        detail = msgspec.json.decode(response.content, type=ErrorBody).error
        assert detail.request_id == request_id
        expected = _STATUS_OVERRIDES.get(response.status_code)
        if expected is not None:
            assert detail.code is expected
        else:
            assert HTTP_STATUS[detail.code] == response.status_code, detail

    return check


@pytest.fixture(scope="module")
def request_ids() -> set[str]:
    return set()


def _client(server: WerkServer, seen: set[str], key: str | None = None) -> httpx.Client:
    return server.client(key, event_hooks={"response": [_check_response(seen)]})


def ok(response: httpx.Response, type: type[_T]) -> _T:
    assert response.status_code == 200, response.text
    return msgspec.json.decode(response.content, type=type)


def error(
    response: httpx.Response, status: int, code: str, *, capability: str | None = None
) -> ErrorDetail:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    detail = msgspec.json.decode(response.content, type=ErrorBody).error
    assert detail.code == code, detail
    assert detail.capability == capability, detail
    return detail


def prefill(http: httpx.Client, model: str, prompt: str, **extra: Any) -> httpx.Response:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "allow_experimental": True}
    body.update(extra)
    return http.post(f"{P}/prefill", json=body)


DISK_PREFER = {"retention": "disk", "reuse": "prefer"}


def generation_of(http: httpx.Client, model: str) -> str:
    """The live process generation of ``model`` (named in its capability reasons)."""
    caps = ok(http.get(f"{P}/capabilities", params={"model": model}), CapabilitiesResponse)
    row = next(r for r in caps.capabilities if r.id == "runtime.pd.prefill")
    assert row.status is CapabilityStatus.EXPERIMENTAL, row
    found = GENERATION.search(row.reason or "")
    assert found is not None, row
    return found.group(0)


def kill_runtime(server: WerkServer, model: str) -> None:
    """Create the testkv kill switch ``<model file>.kill`` (the next operation notices it)."""
    (server.home.parent / f"{model}.testkv.kill").write_text("")


# -- servers ---------------------------------------------------------------------------------

MODELS = {
    "kv": "alpha beta gamma delta epsilon",
    "walk": "one two three four five six",
    "victim": "red green blue",
    "crash": "north south east west",
    "store": "left right up down",
    "broken": "<<fail-start>>",
}


@pytest.fixture(scope="module")
def local(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(models=MODELS)


@pytest.fixture(scope="module")
def keyed(spawn_server: SpawnServer) -> WerkServer:
    return spawn_server(keys=[KEY_A, KEY_B, KEY_C])


@pytest.fixture
def http(local: WerkServer, request_ids: set[str]) -> Iterator[httpx.Client]:
    with _client(local, request_ids) as client:
        yield client


# -- the route table -------------------------------------------------------------------------

# Routes whose success shape testkv cannot produce, with the error they answer instead:
# no loaded adapter moves states between tiers (even the preview is refused: no side-effect-free
# inspection), testkv reports runtime.experts.residency unsupported (no werk_observe_experts),
# and this server never creates jobs.
ERROR_ONLY = {
    ("POST", f"{P}/states/{{state_id}}/tier"): (501, "unsupported", "runtime.state.tier.ram"),
    ("GET", f"{P}/experts"): (501, "unsupported", "runtime.experts.residency"),
    ("POST", f"{P}/experts/{{model}}/prefetch"): (501, "unsupported", "runtime.experts.residency"),
    ("POST", f"{P}/experts/{{model}}/evict"): (501, "unsupported", "runtime.experts.residency"),
    ("GET", f"{P}/jobs/{{job_id}}"): (404, "not_found", None),
}


def test_every_route_answers_with_its_success_shape(http: httpx.Client) -> None:
    """Walk ``ROUTE_SPECS``: each route answers once, decoded with its own response Struct."""
    answered: dict[tuple[str, str], httpx.Response] = {}

    def call(method: str, template: str, body: Any = None, **params: str) -> httpx.Response:
        path = template.format(model="walk", state_id=state_id, job_id="job_0123456789")
        response = http.request(method, path, json=body, params=params or None)
        answered[(method, template)] = response
        return response

    state_id = "st_unset0000"
    assert call("GET", f"{P}/health").json() == {"status": "ok"}
    info = ok(call("GET", f"{P}/info"), InfoResponse)
    assert info.protocol == "1.0" and info.server.auth.value == "unauthenticated_local"
    assert {m.id for m in info.models} == set(MODELS)
    assert info.persistence_defaults is None
    caps = ok(call("GET", f"{P}/capabilities", model="walk"), CapabilitiesResponse)
    assert {r.model for r in caps.capabilities} <= {"walk", None}
    memory = ok(call("GET", f"{P}/memory"), MemoryResponse)
    assert memory.host is not None and memory.host.total_bytes > 0
    loaded = call("POST", f"{P}/models/{{model}}/load", {"dry_run": False})
    assert loaded.json() == {"model": "walk", "resident": True}
    models = call("GET", f"{P}/models").json()["models"]
    walk = next(m for m in models if m["id"] == "walk")
    assert walk["resident"] is True and walk["identity"].startswith("sha256:")
    loaded_runtimes = ok(call("GET", f"{P}/runtimes"), RuntimeList).runtimes
    [walk_runtime] = [r for r in loaded_runtimes if r.model == "walk"]
    assert walk_runtime.busy == 0 and walk_runtime.keep_alive_seconds == 300.0
    assert walk_runtime.idle_until is not None and walk_runtime.reserved_bytes is None
    unloaded = call("POST", f"{P}/models/{{model}}/unload", {"dry_run": True})
    assert unloaded.json() == {"model": "walk", "resident": True}  # a preview changes nothing

    made = ok(
        call(
            "POST",
            f"{P}/prefill",
            {
                "model": "walk",
                "prompt": "route walk",
                "policy": DISK_PREFER,
                "allow_experimental": True,
            },
        ),
        PrefillResponse,
    )
    assert made.state is not None
    state_id = made.state.id
    listing = ok(call("GET", f"{P}/states"), StateList)
    assert state_id in {s.id for s in listing.states}
    assert ok(call("GET", f"{P}/states/{{state_id}}"), StateSummary).id == state_id
    pin = ok(call("POST", f"{P}/states/{{state_id}}/pin", {"pinned": True}), PinResult)
    assert pin.dry_run is True and pin.state.pinned is True
    decoded = ok(call("POST", f"{P}/decode", {"handoff": made.handoff.token}), DecodeResponse)
    assert decoded.text
    stats = ok(call("GET", f"{P}/stats"), StatsResponse)
    [walked] = [m for m in stats.models if m.model == "walk"]
    assert walked.prefills >= 1 and walked.prompt_tokens >= made.usage.prompt_tokens
    pruned = ok(call("POST", f"{P}/states/prune", {"ids": [state_id]}), PruneResult)
    assert pruned.dry_run is True and pruned.selected == [state_id] and pruned.deleted == []
    call("POST", f"{P}/states/{{state_id}}/tier", {"target": "ram"})
    call("GET", f"{P}/experts", model="walk")
    call("POST", f"{P}/experts/{{model}}/prefetch", {"experts": ["e0"]})
    call("POST", f"{P}/experts/{{model}}/evict", {"experts": ["e0"]})
    call("GET", f"{P}/jobs/{{job_id}}")
    stopped = call("POST", f"{P}/models/{{model}}/unload", {"dry_run": False})
    assert stopped.json() == {"model": "walk", "resident": False}
    assert not ok(http.get(f"{P}/states/{state_id}"), StateSummary).reusable  # its runtime is gone

    assert set(answered) == {(s.method, s.path) for s in ROUTE_SPECS}, "a route is not walked"
    for spec in ROUTE_SPECS:
        response = answered[(spec.method, spec.path)]
        if (spec.method, spec.path) in ERROR_ONLY:
            status, code, capability = ERROR_ONLY[(spec.method, spec.path)]
            error(response, status, code, capability=capability)
        elif spec.response is not None:
            ok(response, spec.response)
        else:
            assert response.status_code == 200


def test_openapi_document_lists_exactly_the_served_routes(http: httpx.Client) -> None:
    served = http.get(f"{P}/openapi.json")
    assert served.status_code == 200
    document = served.json()
    assert document["openapi"] == "3.1.0"
    assert document == msgspec.json.decode(msgspec.json.encode(openapi_document()))
    listed = {(m.upper(), path) for path, ops in document["paths"].items() for m in ops}
    openai = set(OPENAI_ROUTES)
    assert listed == {(s.method, s.path) for s in ROUTE_SPECS} | openai
    images = document["paths"]["/v1/images/generations"]["post"]["requestBody"]["content"]
    reference = images["application/json"]["schema"]["$ref"]
    image_schema = document["components"]["schemas"][reference.rsplit("/", 1)[-1]]
    assert image_schema["additionalProperties"] is False  # unknown fields are refused
    assert image_schema["properties"]["prompt"]["maxLength"] == 4000
    assert document["paths"][f"{P}/health"]["get"]["security"] == []
    # The /v1 bodies: what Werk checks (model, stream), the rest goes to the backend.
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]
    schema = chat["application/json"]["schema"]
    assert schema["required"] == ["model", "messages"]
    assert schema["properties"]["stream"] == {"type": "boolean", "default": False}
    assert schema["properties"]["model"]["maxLength"] == 128


def _route_table() -> str:
    rows = ["| method | path | request | 200 response | auth |", "| --- | --- | --- | --- | --- |"]
    for s in ROUTE_SPECS:
        request = f"`{s.request.__name__}`" if s.request else "—"
        response = f"`{s.response.__name__}`" if s.response else '`{"status": "ok"}`'
        auth = "bearer" if s.authenticated else "none"
        rows.append(f"| {s.method} | `{s.path}` | {request} | {response} | {auth} |")
    return "\n".join(rows)


def test_protocol_doc_lists_every_route() -> None:
    """``docs/protocol.md`` carries the route table generated from ``ROUTE_SPECS``."""
    text = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- routes:begin -->\n(.*?)\n<!-- routes:end -->", text, re.S)
    assert found is not None, "docs/protocol.md lacks the routes:begin/end markers"
    expected = _route_table()
    assert found.group(1) == expected, f"regenerate the table in docs/protocol.md:\n{expected}"


# -- request ids -----------------------------------------------------------------------------


def test_request_id_is_fresh_and_client_values_are_ignored(http: httpx.Client) -> None:
    mine = "req_" + "0" * 24
    ids = set()
    for path in (f"{P}/info", f"{P}/states/st_missing0000", "/v1/models", "/nowhere"):
        response = http.get(path, headers={"X-Werk-Request-Id": mine})
        assert response.headers.get_list("x-werk-request-id") != [mine]
        assert len(response.headers.get_list("x-werk-request-id")) == 1
        ids.add(response.headers["x-werk-request-id"])
    assert len(ids) == 4 and mine not in ids


# -- error codes -----------------------------------------------------------------------------


def test_invalid_request_400(http: httpx.Client) -> None:
    json_type = {"content-type": "application/json"}
    detail = error(
        http.post(f"{P}/prefill", content=b'{"model": "kv",', headers=json_type),
        400,
        "invalid_request",
    )
    assert "malformed JSON" in detail.message
    unknown = prefill(http, "kv", "x", bogus=1)
    assert "bogus" in error(unknown, 400, "invalid_request").message
    typo = prefill(http, "kv", "x", policy={"retension": "disk"})
    assert "retension" in error(typo, 400, "invalid_request").message
    for ttl in (0, 2_592_001, -1):
        bad = prefill(http, "kv", "x", policy={"retention": "disk", "ttl_seconds": ttl})
        assert "ttl_seconds" in error(bad, 400, "invalid_request").message
    error(http.post(f"{P}/decode", json={"handoff": "wh_short"}), 400, "invalid_request")
    error(
        prefill(http, "kv", "x", messages=[{"role": "user", "content": "y"}]),
        400,
        "invalid_request",
    )  # both prompt and messages
    error(http.post(f"{P}/states/prune", json={"filter": {}}), 400, "invalid_request")
    error(http.post(f"{P}/states/prune", json={"all": True}), 400, "invalid_request")
    for path, params in (
        (f"{P}/info", {"verbose": "1"}),
        (f"{P}/states", {"colour": "red"}),
        (f"{P}/states", {"pinned": "yes"}),
        (f"{P}/states", {"tier": "tape"}),
        (f"{P}/experts", {}),  # model is required
    ):
        error(http.get(path, params=params), 400, "invalid_request")
    assert (
        "unknown query parameter"
        in error(
            http.post(f"{P}/decode", params={"x": "1"}, json={}), 400, "invalid_request"
        ).message
    )
    # A known route called with the wrong method: 405, code invalid_request (docs/protocol.md).
    wrong_method = http.get(f"{P}/prefill")
    error(wrong_method, 405, "invalid_request")
    assert wrong_method.headers["allow"] == "POST"  # RFC 9110: a 405 names what is allowed
    assert http.post(f"{P}/capabilities", json={}).headers["allow"] == "GET, HEAD"
    assert http.get("/v1/chat/completions").headers["allow"] == "POST"


def test_unauthenticated_401(keyed: WerkServer, request_ids: set[str]) -> None:
    with _client(keyed, request_ids) as anonymous:
        for headers in (
            {},
            {"Authorization": f"Bearer {KEY_A}x"},
            {"Authorization": f"Bearer {KEY_A[:-1]}"},
            {"Authorization": f"Basic {KEY_A}"},
            {"Authorization": KEY_A},
        ):
            response = anonymous.get(f"{P}/info", headers=headers)
            error(response, 401, "unauthenticated")
            assert response.headers["www-authenticate"] == "Bearer"
            assert KEY_A not in response.text
        assert anonymous.get(f"{P}/health").status_code == 200  # the liveness exception
        error(
            anonymous.post(f"{P}/prefill", json={"model": "kv", "prompt": "x"}),
            401,
            "unauthenticated",
        )
    with _client(keyed, request_ids, KEY_A) as alice:
        info = ok(alice.get(f"{P}/info"), InfoResponse)
        assert info.server.auth.value == "api_key"


def test_experimental_opt_in_required_403(http: httpx.Client) -> None:
    assert ok(prefill(http, "kv", "warm up"), PrefillResponse)  # the runtime is live now
    caps = ok(http.get(f"{P}/capabilities", params={"model": "kv"}), CapabilitiesResponse)
    statuses = {r.id: r.status for r in caps.capabilities if r.model == "kv"}
    assert statuses["runtime.pd.prefill"] is CapabilityStatus.EXPERIMENTAL
    refused = prefill(http, "kv", "needs opt-in", allow_experimental=False)
    error(refused, 403, "experimental_opt_in_required", capability="runtime.pd.prefill")
    absent = http.post(f"{P}/prefill", json={"model": "kv", "prompt": "no defaults here"})
    error(absent, 403, "experimental_opt_in_required", capability="runtime.pd.prefill")


def test_not_found_404(http: httpx.Client) -> None:
    error(prefill(http, "nope", "x"), 404, "not_found")
    error(http.get(f"{P}/capabilities", params={"model": "nope"}), 404, "not_found")
    error(http.post(f"{P}/models/nope/load", json={}), 404, "not_found")
    error(http.get(f"{P}/experts", params={"model": "nope"}), 404, "not_found")
    unknown = error(http.get(f"{P}/states/st_{secrets.token_urlsafe(18)}"), 404, "not_found")
    malformed = error(http.get(f"{P}/states/not-a-state-id"), 404, "not_found")
    assert unknown.message == malformed.message
    error(
        http.post(f"{P}/states/st_{secrets.token_urlsafe(18)}/pin", json={"pinned": True}),
        404,
        "not_found",
    )
    error(http.get("/werk/v1/no-such-route"), 404, "not_found")


def test_invalid_handoff_410(http: httpx.Client) -> None:
    made = ok(prefill(http, "kv", "single use"), PrefillResponse)
    ok(http.post(f"{P}/decode", json={"handoff": made.handoff.token}), DecodeResponse)
    reused = error(
        http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff"
    )
    unknown = error(
        http.post(f"{P}/decode", json={"handoff": "wh_" + secrets.token_urlsafe(32)}),
        410,
        "invalid_handoff",
    )
    assert reused.message == unknown.message  # never says which case applied


def test_state_lifecycle_persist_list_inspect_pin_prune_decode(
    http: httpx.Client, local: WerkServer
) -> None:
    prompt = "the lifecycle prompt"
    first = ok(prefill(http, "kv", prompt, policy=DISK_PREFER), PrefillResponse)
    state = first.state
    assert state is not None and state.tier is Tier.DISK and state.reusable and not state.pinned
    assert first.reuse.outcome is ReuseOutcome.FRESH and first.reuse.state_id is None
    assert first.usage.prompt_tokens == len(prompt.encode()) and first.usage.cached_tokens == 0
    assert first.handoff.token.startswith("wh_")
    state_dir = next((local.home / "runtime-state" / "v1").glob(f"p_local/{state.id}"))
    assert (state_dir / "payload.bin").stat().st_size == state.logical_bytes

    second = ok(prefill(http, "kv", prompt, policy=DISK_PREFER), PrefillResponse)
    assert second.reuse.outcome is ReuseOutcome.REUSED and second.reuse.state_id == state.id
    assert second.usage.cached_tokens == second.usage.prompt_tokens == len(prompt.encode())
    assert second.state is not None and second.state.id == state.id

    def listed(**params: str) -> set[str]:
        return {s.id for s in ok(http.get(f"{P}/states", params=params), StateList).states}

    assert state.id in listed() & listed(model="kv") & listed(tier="disk") & listed(pinned="false")
    assert state.id not in listed(tier="backend") | listed(model="walk") | listed(pinned="true")
    inspected = ok(http.get(f"{P}/states/{state.id}"), StateSummary)
    assert (inspected.id, inspected.tier, inspected.reusable) == (state.id, Tier.DISK, True)
    assert inspected.last_accessed_at is not None  # the reuse loaded it

    preview = ok(http.post(f"{P}/states/{state.id}/pin", json={"pinned": True}), PinResult)
    assert preview.dry_run and preview.state.pinned
    assert not ok(http.get(f"{P}/states/{state.id}"), StateSummary).pinned
    pinned = ok(
        http.post(f"{P}/states/{state.id}/pin", json={"pinned": True, "dry_run": False}), PinResult
    )
    assert not pinned.dry_run and pinned.state.pinned
    assert (state_dir / "pinned").exists() and state.id in listed(pinned="true")

    busy = ok(http.post(f"{P}/states/prune", json={"ids": [state.id]}), PruneResult)
    assert busy.dry_run and busy.selected == [state.id] and busy.deleted == []
    assert busy.skipped[0].reason.value in ("pinned", "live_handoff")
    texts = {
        ok(
            http.post(f"{P}/decode", json={"handoff": h.token, "max_tokens": 8}), DecodeResponse
        ).text
        for h in (first.handoff, second.handoff)
    }
    assert len(texts) == 1 and texts != {""}  # the same prefix decodes the same (testkv)
    still_pinned = ok(
        http.post(f"{P}/states/prune", json={"ids": [state.id], "dry_run": False}), PruneResult
    )
    assert still_pinned.deleted == [] and [s.reason.value for s in still_pinned.skipped] == [
        "pinned"
    ]
    ok(http.post(f"{P}/states/{state.id}/pin", json={"pinned": False, "dry_run": False}), PinResult)
    preview_prune = ok(http.post(f"{P}/states/prune", json={"ids": [state.id]}), PruneResult)
    assert preview_prune.dry_run and preview_prune.selected == [state.id]
    assert preview_prune.deleted == [] and preview_prune.skipped == []
    assert state_dir.is_dir()  # a dry run deletes nothing
    executed = ok(
        http.post(f"{P}/states/prune", json={"ids": [state.id], "dry_run": False}), PruneResult
    )
    assert not executed.dry_run and executed.deleted == [state.id]
    assert not state_dir.exists()
    error(http.get(f"{P}/states/{state.id}"), 404, "not_found")
    assert state.id not in listed()


def test_killed_runtime_old_state_incompatible_and_respawn(
    http: httpx.Client, local: WerkServer
) -> None:
    prompt = "survive the crash"
    made = ok(prefill(http, "victim", prompt, policy=DISK_PREFER), PrefillResponse)
    assert made.state is not None
    old = made.state.id
    old_generation = generation_of(http, "victim")
    kill_runtime(local, "victim")
    caps = ok(http.get(f"{P}/capabilities", params={"model": "victim"}), CapabilitiesResponse)
    row = next(r for r in caps.capabilities if r.id == "runtime.pd.prefill")
    assert row.status is CapabilityStatus.UNAVAILABLE  # the query noticed the death
    assert not ok(http.get(f"{P}/states/{old}"), StateSummary).reusable
    assert [
        s.reusable
        for s in ok(http.get(f"{P}/states", params={"model": "victim"}), StateList).states
    ] == [False]
    error(http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff")

    required = prefill(http, "victim", prompt, policy={"retention": "disk", "reuse": "required"})
    # It exists, but for a dead generation, and the new one does not claim cross-restart
    # restore: the refusal names that row and gives its reason.
    message = error(
        required, 409, "incompatible_state", capability="runtime.state.restore.cross_restart"
    ).message
    assert "cannot be restored into the running one: cross-restart restore is" in message
    assert "testkv states are bound to one in-process runtime generation" in message
    new_generation = generation_of(http, "victim")  # that request respawned the runtime
    assert new_generation != old_generation
    never_seen = prefill(http, "victim", "never seen", policy={"reuse": "required"})
    error(never_seen, 409, "reuse_unavailable")
    fresh = ok(prefill(http, "victim", prompt, policy=DISK_PREFER), PrefillResponse)
    assert fresh.reuse.outcome is ReuseOutcome.FRESH
    assert fresh.state is not None and fresh.state.id != old and fresh.state.reusable
    assert fresh.usage.cached_tokens == 0
    again = ok(
        prefill(http, "victim", prompt, policy={"retention": "disk", "reuse": "required"}),
        PrefillResponse,
    )
    assert again.reuse.outcome is ReuseOutcome.REUSED and again.reuse.state_id == fresh.state.id
    by_id = {
        s.id: s for s in ok(http.get(f"{P}/states", params={"model": "victim"}), StateList).states
    }
    assert (by_id[old].reusable, by_id[fresh.state.id].reusable) == (False, True)


def test_unavailable_503(http: httpx.Client, local: WerkServer) -> None:
    first = error(
        prefill(http, "broken", "x"), 503, "unavailable", capability="runtime.model_residency"
    )
    assert first.retryable
    assert error(
        prefill(http, "broken", "x"), 503, "unavailable", capability="runtime.model_residency"
    ).retryable  # backoff, fails fast
    # A runtime killed between prefill and decode: the handoff's runtime is gone.
    made = ok(prefill(http, "crash", "mid flow"), PrefillResponse)
    kill_runtime(local, "crash")
    dead = error(
        http.post(f"{P}/decode", json={"handoff": made.handoff.token}),
        503,
        "unavailable",
        capability="runtime.pd.decode",
    )
    assert dead.retryable
    error(http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff")
    assert ok(prefill(http, "crash", "after the crash"), PrefillResponse)  # respawned


def test_payload_too_large_413(http: httpx.Client) -> None:
    json_type = {"content-type": "application/json"}
    head = b'{"handoff": "wh_' + secrets.token_urlsafe(24).encode() + b'"'
    at_bound = head + b" " * (SMALL_BODY - len(head) - 1) + b"}"
    assert len(at_bound) == SMALL_BODY
    error(http.post(f"{P}/decode", content=at_bound, headers=json_type), 410, "invalid_handoff")
    over = head + b" " * (SMALL_BODY - len(head)) + b"}"
    error(http.post(f"{P}/decode", content=over, headers=json_type), 413, "payload_too_large")

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused while streaming
        yield head
        yield b" " * (SMALL_BODY - len(head))
        yield b"}"

    error(http.post(f"{P}/decode", content=chunked(), headers=json_type), 413, "payload_too_large")
    error(
        http.post(f"{P}/states/st_abcdefgh1234/pin", content=over, headers=json_type),
        413,
        "payload_too_large",
    )


def test_huge_completion_is_backend_error_502(http: httpx.Client) -> None:
    """PROTOCOL.md §6: completion text over 1 MiB is ``502 backend_error`` (not 413)."""
    made = ok(prefill(http, "kv", "make it <<huge>>"), PrefillResponse)
    detail = error(
        http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 502, "backend_error"
    )
    assert "1048576" in detail.message
    error(http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff")


def test_backend_error_502_never_leaks_backend_text(http: httpx.Client, local: WerkServer) -> None:
    failed = error(prefill(http, "kv", "boom <<fail-prefill>>"), 502, "backend_error")
    assert failed.message == "backend 'testkv' failed during prefill"
    made = ok(prefill(http, "kv", "boom <<fail-decode>>"), PrefillResponse)
    detail = error(
        http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 502, "backend_error"
    )
    assert detail.message == "backend 'testkv' failed during decode"
    # Single use even though decode failed.
    error(http.post(f"{P}/decode", json={"handoff": made.handoff.token}), 410, "invalid_handoff")
    body = {"model": "kv", "messages": [{"role": "user", "content": "<<fail-decode>>"}]}
    v1 = http.post("/v1/chat/completions", json=body)
    assert v1.status_code == 502 and v1.json()["error"]["code"] == "backend_error"
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.status_code == 200  # the status line is gone before the failure
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    failure = msgspec.json.decode(events[-2])["error"]
    assert failure["code"] == "backend_error", failure  # a backend failure, not a Werk bug
    assert SECRET in local.log()  # the detail went to the server log only


def test_unsupported_501(http: httpx.Client) -> None:
    made = ok(prefill(http, "kv", "tier me", policy={"retention": "disk"}), PrefillResponse)
    assert made.state is not None
    for target in ("ram", "vram", "backend", "disk"):
        for dry_run in (True, False):
            response = http.post(
                f"{P}/states/{made.state.id}/tier", json={"target": target, "dry_run": dry_run}
            )
            capability = {
                "ram": "runtime.state.tier.ram",
                "vram": "runtime.state.tier.vram",
                "backend": "runtime.state.prefix_cache",
                "disk": "runtime.state.tier.disk",
            }[target]
            error(response, 501, "unsupported", capability=capability)
    error(
        http.post(
            f"{P}/experts/kv/evict",
            json={"experts": ["e1"], "dry_run": False, "allow_experimental": True},
        ),
        501,
        "unsupported",
        capability="runtime.experts.residency",
    )
    error(
        prefill(http, "kv", "memory tier", policy={"retention": "memory"}),
        501,
        "unsupported",
        capability="runtime.state.tier.ram",
    )


def test_resource_exhausted_429_at_128_live_handoffs(
    keyed: WerkServer, request_ids: set[str]
) -> None:
    with _client(keyed, request_ids, KEY_C) as carol, _client(keyed, request_ids, KEY_B) as bob:
        tokens = [
            ok(prefill(carol, "kv", f"slot {i}"), PrefillResponse).handoff.token for i in range(128)
        ]
        full = error(prefill(carol, "kv", "one too many"), 429, "resource_exhausted")
        assert full.retryable
        assert ok(prefill(bob, "kv", "another principal"), PrefillResponse)  # per-principal
        ok(carol.post(f"{P}/decode", json={"handoff": tokens[0]}), DecodeResponse)
        assert ok(prefill(carol, "kv", "a slot was freed"), PrefillResponse)
        error(prefill(carol, "kv", "full again"), 429, "resource_exhausted")
        for token in tokens[1:]:  # every earlier handoff is still valid: nothing was evicted
            assert (
                carol.post(f"{P}/decode", json={"handoff": token, "max_tokens": 1}).status_code
                == 200
            )


def test_internal_500_is_generic_and_logged(http: httpx.Client, local: WerkServer) -> None:
    """A broken store (its ``.lock`` replaced by a directory) is a Werk-side failure."""
    assert ok(prefill(http, "store", "first", policy={"retention": "disk"}), PrefillResponse)
    lock = local.home / "runtime-state" / "v1" / ".lock"
    lock.unlink()
    lock.mkdir()
    try:
        response = prefill(http, "store", "second", policy={"retention": "disk"})
        detail = error(response, 500, "internal")
        request_id = response.headers["x-werk-request-id"]
        assert detail.message == f"internal error; see the server log for {request_id}"
        assert str(local.home) not in response.text
        assert f"internal error [{request_id}]" in local.log()
    finally:
        lock.rmdir()
    assert ok(prefill(http, "store", "third", policy={"retention": "disk"}), PrefillResponse)


def test_unreachable_codes_are_not_raised_on_the_serving_path() -> None:
    """``conflict`` (409) and ``timeout`` (504) cannot be produced through HTTP today.

    * ``conflict``: only the expert policy engine (``werk/experts``) raises it (two moves
      claiming the same experts, or a pinned expert). The experts routes reach that engine only
      through an adapter whose ``runtime.experts.residency`` is operational; testkv reports it
      ``unsupported``, so they answer ``501`` here. Busy or pinned *states* are prune
      ``skipped`` entries, never an error.
    * ``timeout``: no server-side code path bounds a backend call with a deadline; only the
      bundled client raises :class:`werk.WerkTimeout` (tested in ``test_client.py``).

    This check keeps that statement true: when someone adds a raise on the serving path it fails,
    and an end-to-end test for the new code belongs in this module.
    """
    serving = [REPO / "werk" / d for d in ("control", "http", "state")]
    offenders = [
        f"{path.relative_to(REPO)}: {name}"
        for root in serving
        for path in sorted(root.rglob("*.py"))
        for name in ("Conflict(", "WerkTimeout(")
        if name in path.read_text(encoding="utf-8")
    ]
    assert offenders == []
