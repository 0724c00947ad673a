"""The error table of PROTOCOL.md §1: one exception class per code, its HTTP status, its body."""

from __future__ import annotations

import msgspec
import pytest

import werk
import werk.protocol as protocol
from werk.protocol import (
    HTTP_STATUS,
    ErrorBody,
    ErrorCode,
    ResourceExhausted,
    Unavailable,
    WerkError,
    decode,
    encode,
    error_class,
)

# Copied literally from PROTOCOL.md §1 "Error body and codes" (code → HTTP status).
PROTOCOL_TABLE: dict[str, int] = {
    "invalid_request": 400,
    "unauthenticated": 401,
    "experimental_opt_in_required": 403,
    "not_found": 404,
    "invalid_handoff": 410,
    "incompatible_state": 409,
    "reuse_unavailable": 409,
    "conflict": 409,
    "payload_too_large": 413,
    "resource_exhausted": 429,
    "internal": 500,
    "unsupported": 501,
    "backend_error": 502,
    "unavailable": 503,
    "timeout": 504,
}


def _code_classes() -> dict[ErrorCode, list[type[WerkError]]]:
    """Direct subclasses of WerkError defined by werk itself, grouped by code."""
    by_code: dict[ErrorCode, list[type[WerkError]]] = {}
    for cls in WerkError.__subclasses__():
        if cls.__module__.split(".")[0] == "werk":
            by_code.setdefault(cls.code, []).append(cls)
    return by_code


def test_codes_are_exactly_the_protocol_codes() -> None:
    assert {c.value for c in ErrorCode} == set(PROTOCOL_TABLE)


def test_http_status_table_matches_the_protocol() -> None:
    assert {code.value: status for code, status in HTTP_STATUS.items()} == PROTOCOL_TABLE


def test_every_code_has_exactly_one_subclass() -> None:
    by_code = _code_classes()
    assert set(by_code) == set(ErrorCode)
    duplicated = {code: classes for code, classes in by_code.items() if len(classes) != 1}
    assert duplicated == {}


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.value for c in ErrorCode])
def test_each_subclass_has_its_status_and_is_public(code: ErrorCode) -> None:
    (cls,) = _code_classes()[code]
    assert error_class(code) is cls
    assert error_class(code.value) is cls
    assert cls(message="m").http_status == PROTOCOL_TABLE[code.value]
    # Plugins import only public names: every error class is exported by werk and werk.protocol.
    assert getattr(werk, cls.__name__) is cls
    assert getattr(protocol, cls.__name__) is cls


def test_unknown_code_fails_closed() -> None:
    with pytest.raises(ValueError):
        error_class("teapot")


def test_resource_exhausted_is_retryable() -> None:
    assert werk.ResourceExhausted("full").retryable is True
    body = msgspec.json.decode(encode(werk.ResourceExhausted("full").to_body("req_1")))
    assert body["error"]["retryable"] is True


@pytest.mark.parametrize(
    "code",
    [
        c
        for c in ErrorCode
        if 400 <= PROTOCOL_TABLE[c.value] < 500 and c.value != "resource_exhausted"
    ],
)
def test_client_errors_are_not_retryable(code: ErrorCode) -> None:
    """Repeating a request that was wrong cannot make it right."""
    assert error_class(code)("m").retryable is False


def test_retryable_can_be_overridden() -> None:
    assert werk.ResourceExhausted("full", retryable=False).retryable is False
    assert werk.Conflict("busy", retryable=True).retryable is True


def test_to_body_shape_with_capability() -> None:
    err = werk.Unsupported("no snapshots here", capability="runtime.state.persistence")
    body = msgspec.json.decode(encode(err.to_body(request_id="req_abc")))
    assert body == {
        "error": {
            "code": "unsupported",
            "message": "no snapshots here",
            "retryable": False,
            "request_id": "req_abc",
            "capability": "runtime.state.persistence",
        }
    }


def test_capability_is_omitted_when_none() -> None:
    body = msgspec.json.decode(encode(werk.NotFound("no such state").to_body("req_1")))
    assert body == {
        "error": {
            "code": "not_found",
            "message": "no such state",
            "retryable": False,
            "request_id": "req_1",
        }
    }


def test_retryable_is_always_present() -> None:
    """PROTOCOL.md §1: only ``capability`` is conditional; ``retryable: false`` is shown."""
    for code in ErrorCode:
        body = msgspec.json.decode(encode(error_class(code)("m").to_body("req_1")))
        assert isinstance(body["error"]["retryable"], bool), code


@pytest.mark.parametrize("code", list(ErrorCode), ids=[c.value for c in ErrorCode])
def test_error_class_round_trip_through_the_wire(code: ErrorCode) -> None:
    original = error_class(code)("it went wrong", capability="runtime.pd.decode")
    wire = encode(original.to_body("req_9"))
    detail = decode(wire, ErrorBody).error
    rebuilt = error_class(detail.code)(
        detail.message, capability=detail.capability, retryable=detail.retryable
    )
    assert type(rebuilt) is type(original)
    assert (rebuilt.message, rebuilt.capability, rebuilt.retryable) == (
        original.message,
        original.capability,
        original.retryable,
    )
    assert detail.request_id == "req_9"


def test_error_body_tolerates_unknown_fields() -> None:
    wire = b'{"error": {"code": "conflict", "message": "busy", "retryable": false, "hint": 1}}'
    assert decode(wire, ErrorBody).error.code is ErrorCode.CONFLICT


def test_werk_error_carries_message_and_repr() -> None:
    err = werk.Unavailable("no process", capability="runtime.model_residency")
    assert str(err) == "no process"
    assert err.message == "no process"
    assert repr(err) == "Unavailable('no process', capability='runtime.model_residency')"
    assert isinstance(err, Exception)


@pytest.mark.parametrize(
    ("error", "path", "retry_after"),
    [
        (ResourceExhausted("full", retry_after=7), "/werk/v1/prefill", "7"),
        (ResourceExhausted("full"), "/v1/chat/completions", "1"),  # a 429 always says when
        (Unavailable("starting", retryable=True, retry_after=3), "/werk/v1/decode", "3"),
        (Unavailable("gone"), "/werk/v1/decode", None),  # not retryable: no hint
    ],
)
def test_retryable_errors_say_when_to_come_back(
    error: WerkError, path: str, retry_after: str | None
) -> None:
    from starlette.requests import Request

    from werk.http.errors import error_response

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b""}
    response = error_response(Request(scope), error)
    assert response.status_code == error.http_status
    assert response.headers.get("retry-after") == retry_after
