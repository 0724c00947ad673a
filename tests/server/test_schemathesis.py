"""schemathesis fuzzes ``/werk/v1`` from the OpenAPI document a live ``werk serve`` publishes.

The server runs with an API key (the fuzzer sends it) and one testkv model. The document is
fetched over HTTP from ``/werk/v1/openapi.json``; every operation in it gets a bounded number
of generated requests, schema-conforming (positive) and schema-violating (negative). Each
response must pass schemathesis' checks: no 5xx, a status the document declares, the declared
content type, a body that validates against the declared schema, negative data rejected.

(``schemathesis.pytest.from_fixture`` does not work with pytest 9 — it writes
``Function._nodeid`` — so the operations are parametrized here and each one runs a Hypothesis
test built from ``APIOperation.as_strategy``.)
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from _server import OPENAI_ROUTES, WerkServer, import_model, werk_serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.core.parameters import ParameterLocation

from werk.http.routes import ROUTE_SPECS

KEY = "schemathesis-key-0123456789"
MODEL = "kv"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_EXAMPLES = int(os.environ.get("WERK_TEST_FUZZ_EXAMPLES", "25"))

# schemathesis' default expectations, plus two statuses a JSON Schema cannot predict:
# * 410: a well-formed handoff that this server never issued (or already consumed) is
#   ``invalid_handoff`` by protocol design ("a token issued to you" is not a schema);
# * 413: bodies are bounded per route in bytes before parsing (``maxItems`` × ``maxLength`` of
#   an expert list can exceed the 64 KiB bound).
# 5xx stays an error, with one exception: 501 is the protocol's ``unsupported`` answer for a
# capability the backend does not have (testkv has no experts). The test asserts that every 501
# carries exactly that code and names the capability; any other 5xx fails the run.
CONFIG = """
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "501"]

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "410", "413", "429", "5xx"]

[checks.negative_data_rejection]
expected-statuses = [
    "400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx",
]
"""

OPERATIONS = [(s.method, s.path) for s in ROUTE_SPECS]
# Negative generation needs something to break: a parameter, a body or credentials. The
# liveness probe has none of these.
NEGATABLE = [
    (s.method, s.path)
    for s in ROUTE_SPECS
    if s.authenticated or s.request is not None or "{" in s.path
]
CASES = [(m, p, "positive") for m, p in OPERATIONS] + [(m, p, "negative") for m, p in NEGATABLE]


@pytest.fixture(scope="module")
def fuzz_server(
    tmp_path_factory: pytest.TempPathFactory, testkv_site: Path
) -> Iterator[WerkServer]:
    home = tmp_path_factory.mktemp("fuzz") / "home"
    home.mkdir()
    import_model(home, testkv_site, MODEL)
    with werk_serve(home, testkv_site, ["--model", MODEL, "--api-key", KEY]) as server:
        yield server


@pytest.fixture(scope="module")
def api_schema(fuzz_server: WerkServer) -> Any:
    return schemathesis.openapi.from_url(
        f"{fuzz_server.base_url}/werk/v1/openapi.json",
        config=schemathesis.Config.from_str(CONFIG),
        headers=AUTH,
        timeout=30,
    )


def test_document_lists_every_served_operation(api_schema: Any) -> None:
    served = set()
    for result in api_schema.get_all_operations():
        operation = result.ok()
        served.add((operation.method.upper(), operation.path))
    # The /v1 routes are published too; they are not fuzzed here (their bodies are the
    # backend's to validate, and tests/server/test_openai_sdk.py drives them with the SDK).
    openai = set(OPENAI_ROUTES)
    assert served == set(OPERATIONS) | openai


def _known_model(case: Any) -> Any:
    """Point a schema-valid case at the served model, so fuzzing reaches the backend too."""
    if "model" in (case.path_parameters or {}):
        case.path_parameters["model"] = MODEL
    if "model" in (case.query or {}):
        case.query["model"] = MODEL
    if isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    return case


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[" ".join(c) for c in CASES])
def test_operation_conforms(
    api_schema: Any, fuzz_server: WerkServer, method: str, path: str, mode: str
) -> None:
    operation = api_schema[path][method.lower()]
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode))
    if mode == "positive":
        strategy = st.one_of(strategy, strategy.map(_known_model))
    statuses: Counter[int] = Counter()

    @given(case=strategy)
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def fuzz(case: Any) -> None:
        # A negative case whose headers were generated to violate the schema (the required
        # Authorization left out) must be sent as generated: adding the key back would turn
        # it into a valid request that schemathesis still counts as negative.
        unauthenticated = case.meta is not None and case.meta.is_negative_at(
            ParameterLocation.HEADER
        )
        response = case.call_and_validate(headers=None if unauthenticated else AUTH, timeout=30)
        statuses[response.status_code] += 1
        assert response.headers["x-werk-request-id"][0].startswith("req_")
        if response.status_code == 501:
            error = json.loads(response.content)["error"]
            assert error["code"] == "unsupported", error
            assert error["capability"], error

    fuzz()
    print(f"{method} {path} [{mode}]: {sum(statuses.values())} requests, {dict(statuses)}")
    assert fuzz_server.process.poll() is None, "the server died under fuzzing"
    assert statuses, "no request was sent"
    if mode == "positive":
        assert 401 not in statuses, "the fuzzer's API key was refused"
