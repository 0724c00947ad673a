"""Every wire Struct round-trips through JSON; requests fail closed, responses tolerate the future.

The Structs are discovered from ``werk.protocol.__all__``, and value strategies are derived from
``msgspec.inspect`` type information (which carries every ``msgspec.Meta`` constraint), so a new
Struct is covered without editing this file. Structs whose ``__post_init__`` rules are too
selective for rejection sampling get an explicit strategy in :data:`EXPLICIT`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import werk
import werk.protocol as protocol
from werk.protocol import (
    CORE_CAPABILITY_IDS,
    CapabilityReport,
    CapabilityStatus,
    DecodeRequest,
    PersistenceDefaults,
    Policy,
    PrefillRequest,
    PruneFilter,
    PruneRequest,
    Request,
    Response,
    decode,
    encode,
)

# ------------------------------------------------------------------------------------------------
# Discovery
# ------------------------------------------------------------------------------------------------

EXPORTED_STRUCTS: list[type[msgspec.Struct]] = sorted(
    (
        obj
        for name in protocol.__all__
        if isinstance(obj := getattr(protocol, name), type) and issubclass(obj, msgspec.Struct)
    ),
    key=lambda cls: cls.__name__,
)
REQUEST_STRUCTS = [c for c in EXPORTED_STRUCTS if issubclass(c, Request) and c is not Request]
RESPONSE_STRUCTS = [c for c in EXPORTED_STRUCTS if issubclass(c, Response) and c is not Response]


def _all_subclasses(cls: type[msgspec.Struct]) -> set[type[msgspec.Struct]]:
    out: set[type[msgspec.Struct]] = set()
    sub: type[msgspec.Struct]
    for sub in cls.__subclasses__():
        out |= {sub} | _all_subclasses(sub)
    return out


def _ids(classes: Sequence[type[msgspec.Struct]]) -> list[str]:
    return [c.__name__ for c in classes]


# ------------------------------------------------------------------------------------------------
# Strategies from msgspec type information
# ------------------------------------------------------------------------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# JSON carries any Unicode scalar value; lone surrogates are not valid UTF-8 at all.
TEXT = st.characters(codec="utf-8")
OMIT: Any = object()

JSON_VALUES: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(TEXT, max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(TEXT, max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)


def _bounds(t: mi.IntType) -> tuple[int, int]:
    lo = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else INT64_MIN)
    hi = t.le if t.le is not None else (t.lt - 1 if t.lt is not None else INT64_MAX)
    return lo, hi


def _sizes(min_length: int | None, max_length: int | None, spread: int) -> tuple[int, int]:
    lo = min_length or 0
    hi = lo + spread if max_length is None else min(max_length, lo + spread)
    return lo, hi


def value_strategy(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy producing values that satisfy ``t`` including its Meta constraints."""
    if isinstance(t, mi.StructType):
        return struct_strategy(t.cls)
    if isinstance(t, mi.Metadata):
        return value_strategy(t.type)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.IntType):
        assert t.multiple_of is None, "extend the builder for multiple_of"
        lo, hi = _bounds(t)
        return st.integers(lo, hi)
    if isinstance(t, mi.FloatType):
        assert t.multiple_of is None, "extend the builder for multiple_of"
        return st.floats(
            min_value=t.ge if t.ge is not None else t.gt,
            max_value=t.le if t.le is not None else t.lt,
            exclude_min=t.gt is not None,
            exclude_max=t.lt is not None,
            allow_nan=False,
            allow_infinity=False,
        )
    if isinstance(t, mi.StrType):
        lo, hi = _sizes(t.min_length, t.max_length, 16)
        if t.pattern is not None:
            return st.from_regex(t.pattern, fullmatch=True).filter(
                lambda s: lo <= len(s) and (t.max_length is None or len(s) <= t.max_length)
            )
        return st.text(TEXT, min_size=lo, max_size=hi)
    if isinstance(t, mi.ListType):
        lo, hi = _sizes(t.min_length, t.max_length, 3)
        return st.lists(value_strategy(t.item_type), min_size=lo, max_size=hi)
    if isinstance(t, mi.DictType):
        lo, hi = _sizes(t.min_length, t.max_length, 3)
        return st.dictionaries(
            value_strategy(t.key_type), value_strategy(t.value_type), min_size=lo, max_size=hi
        )
    if isinstance(t, mi.AnyType):
        return JSON_VALUES
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.UnionType):
        return st.one_of(*(value_strategy(member) for member in t.types))
    raise NotImplementedError(f"no strategy for {t!r}; extend value_strategy")


def fields_strategy(
    cls: type[msgspec.Struct], **fixed: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for ``cls``: optional fields are sometimes left to their default."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    members: dict[str, st.SearchStrategy[Any]] = {}
    for f in info.fields:
        strategy = fixed.get(f.name, value_strategy(f.type))
        members[f.name] = strategy if f.required or f.name in fixed else st.just(OMIT) | strategy
    return st.fixed_dictionaries(members).map(
        lambda kw: {k: v for k, v in kw.items() if v is not OMIT}
    )


def _construct(cls: type[msgspec.Struct], kwargs: dict[str, Any]) -> Any:
    try:
        return cls(**kwargs)
    except (ValueError, TypeError):  # a __post_init__ rule; rejection-sample it away
        return None


PLUGIN_CAPABILITY_IDS = st.from_regex(
    r"[a-z][a-z0-9_-]{0,8}(\.[a-z][a-z0-9_]{0,8}){1,3}", fullmatch=True
).filter(lambda s: not s.startswith("runtime."))


@st.composite
def _capability_reports(draw: st.DrawFn) -> CapabilityReport:
    status = draw(st.sampled_from(list(CapabilityStatus)))
    reason_text = st.text(TEXT, min_size=1, max_size=40)
    reason = st.none() | reason_text if status is CapabilityStatus.SUPPORTED else reason_text
    kwargs = draw(
        fields_strategy(
            CapabilityReport,
            id=st.sampled_from(sorted(CORE_CAPABILITY_IDS)) | PLUGIN_CAPABILITY_IDS,
            status=st.just(status),
            reason=reason,
        )
    )
    return CapabilityReport(**kwargs)


@st.composite
def _prefill_requests(draw: st.DrawFn) -> PrefillRequest:
    info = {f.name: f.type for f in mi.type_info(PrefillRequest).fields}  # type: ignore[attr-defined]
    use_prompt = draw(st.booleans())
    chosen = "prompt" if use_prompt else "messages"
    other = "messages" if use_prompt else "prompt"
    # The chosen one gets a non-null value: strip NoneType out of its ``X | None`` union.
    union = info[chosen]
    assert isinstance(union, mi.UnionType)
    non_null = st.one_of(
        *(value_strategy(t) for t in union.types if not isinstance(t, mi.NoneType))
    )
    kwargs = draw(
        fields_strategy(PrefillRequest, **{chosen: non_null, other: st.just(OMIT) | st.none()})
    )
    return PrefillRequest(**{k: v for k, v in kwargs.items() if v is not OMIT})


@st.composite
def _prune_requests(draw: st.DrawFn) -> PruneRequest:
    info = {f.name: f.type for f in mi.type_info(PruneRequest).fields}  # type: ignore[attr-defined]
    ids_type = info["ids"]
    assert isinstance(ids_type, mi.UnionType)
    selector = draw(st.sampled_from(["ids", "filter", "all"]))
    dry_run = draw(st.just(OMIT) | st.booleans())
    kwargs: dict[str, Any] = {} if dry_run is OMIT else {"dry_run": dry_run}
    if selector == "ids":
        kwargs["ids"] = draw(value_strategy(ids_type.types[0]))
    elif selector == "filter":
        kwargs["filter"] = draw(struct_strategy(PruneFilter))
    else:
        kwargs.update(all=True, confirm="all")
    return PruneRequest(**kwargs)


EXPLICIT: dict[type[msgspec.Struct], Callable[[], st.SearchStrategy[Any]]] = {
    CapabilityReport: _capability_reports,
    PrefillRequest: _prefill_requests,
    PruneRequest: _prune_requests,
}
"""Structs whose ``__post_init__`` rules reject too much for rejection sampling."""

_STRATEGIES: dict[type[msgspec.Struct], st.SearchStrategy[Any]] = {}


def struct_strategy(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    if cls not in _STRATEGIES:
        if cls in EXPLICIT:
            _STRATEGIES[cls] = EXPLICIT[cls]()
        else:
            _STRATEGIES[cls] = (
                fields_strategy(cls)
                .map(lambda kw: _construct(cls, kw))
                .filter(lambda value: value is not None)
            )
    return _STRATEGIES[cls]


# ------------------------------------------------------------------------------------------------
# Round trips
# ------------------------------------------------------------------------------------------------


def test_discovery_found_the_protocol_structs() -> None:
    names = set(_ids(EXPORTED_STRUCTS))
    # A sample of both kinds, so an empty discovery cannot pass the parametrised tests vacuously.
    assert {"PrefillRequest", "PruneRequest", "DecodeRequest", "Policy"} <= names
    assert {"CapabilityReport", "StateSummary", "MemoryResponse", "ErrorBody"} <= names
    assert len(REQUEST_STRUCTS) >= 8
    assert len(RESPONSE_STRUCTS) >= 30


@pytest.mark.parametrize("cls", EXPORTED_STRUCTS, ids=_ids(EXPORTED_STRUCTS))
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_json_round_trip(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    value = data.draw(struct_strategy(cls), label=cls.__name__)
    assert isinstance(value, cls)
    assert decode(encode(value), type(value)) == value


def test_every_exported_struct_is_a_request_or_a_response() -> None:
    """Each wire shape must have decided how it treats unknown fields."""
    undecided = [
        c.__name__
        for c in EXPORTED_STRUCTS
        if c not in (Request, Response) and not issubclass(c, Request | Response)
    ]
    assert undecided == []


# ------------------------------------------------------------------------------------------------
# Requests fail closed
# ------------------------------------------------------------------------------------------------


def test_every_request_subclass_forbids_unknown_fields() -> None:
    subclasses = _all_subclasses(Request) | set(REQUEST_STRUCTS)
    assert set(REQUEST_STRUCTS) <= subclasses
    lax = [c.__qualname__ for c in subclasses if not c.__struct_config__.forbid_unknown_fields]
    assert lax == []


def test_every_response_subclass_tolerates_unknown_fields() -> None:
    strict = [
        c.__qualname__
        for c in _all_subclasses(Response)
        if c.__struct_config__.forbid_unknown_fields
    ]
    assert strict == []


@pytest.mark.parametrize("cls", REQUEST_STRUCTS, ids=_ids(REQUEST_STRUCTS))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_request_rejects_unknown_field(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    body = msgspec.to_builtins(data.draw(struct_strategy(cls)))
    body["unexpected_field"] = 1
    with pytest.raises(werk.InvalidRequest, match="unexpected_field"):
        decode(encode(body), cls)


@pytest.mark.parametrize("cls", RESPONSE_STRUCTS, ids=_ids(RESPONSE_STRUCTS))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_response_ignores_unknown_field(cls: type[msgspec.Struct], data: st.DataObject) -> None:
    value = data.draw(struct_strategy(cls))
    body = msgspec.to_builtins(value)
    body["field_from_a_newer_server"] = {"nested": [1, 2]}
    assert decode(encode(body), cls) == value


def test_nested_typo_in_policy_is_rejected_with_its_path() -> None:
    body = b'{"model": "demo", "prompt": "hi", "policy": {"retension": "disk"}}'
    with pytest.raises(werk.InvalidRequest) as info:
        decode(body, PrefillRequest)
    assert "retension" in info.value.message
    assert "$.policy" in info.value.message


def test_malformed_json_is_invalid_request() -> None:
    with pytest.raises(werk.InvalidRequest, match="malformed JSON"):
        decode(b'{"model": "demo", "prompt": ', PrefillRequest)


# -- TTL --------------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [protocol.TTL_MIN_SECONDS, 2, 86_400, protocol.TTL_MAX_SECONDS])
def test_ttl_in_range_is_accepted(ttl: int) -> None:
    assert decode(encode({"ttl_seconds": ttl}), Policy).ttl_seconds == ttl
    assert decode(encode({"ttl_seconds": ttl}), PersistenceDefaults).ttl_seconds == ttl


@pytest.mark.parametrize("ttl", [0, -1, 2_592_001, 10**12])
def test_ttl_out_of_range_is_rejected(ttl: int) -> None:
    with pytest.raises(werk.InvalidRequest, match=r"ttl_seconds"):
        decode(encode({"ttl_seconds": ttl}), Policy)
    body = {"model": "demo", "prompt": "hi", "policy": {"ttl_seconds": ttl}}
    with pytest.raises(werk.InvalidRequest, match=r"\$\.policy\.ttl_seconds"):
        decode(encode(body), PrefillRequest)


def test_ttl_bounds_are_the_protocol_bounds() -> None:
    assert (protocol.TTL_MIN_SECONDS, protocol.TTL_MAX_SECONDS) == (1, 2_592_000)


def test_policy_defaults_are_the_protocol_defaults() -> None:
    policy = decode(b"{}", Policy)
    assert msgspec.to_builtins(policy) == {
        "retention": "ephemeral",
        "reuse": "disabled",
        "ttl_seconds": None,
        "pin": False,
    }


@pytest.mark.parametrize("field", ["retention", "reuse"])
def test_policy_enums_reject_unknown_values(field: str) -> None:
    with pytest.raises(werk.InvalidRequest, match=field):
        decode(encode({field: "sometimes"}), Policy)


# -- capability statuses ------------------------------------------------------------------------

SIX_STATUSES = {
    "supported",
    "unsupported",
    "unavailable",
    "experimental",
    "externally_managed",
    "metadata_only",
}


def test_exactly_six_statuses() -> None:
    assert {s.value for s in CapabilityStatus} == SIX_STATUSES


@pytest.mark.parametrize("status", sorted(SIX_STATUSES))
def test_each_status_decodes(status: str) -> None:
    row = {"id": "runtime.pd.prefill", "status": status, "reason": "why"}
    assert decode(encode(row), CapabilityReport).status == status


@pytest.mark.parametrize("status", ["partial", "true", "SUPPORTED", "", "available"])
def test_other_statuses_are_rejected(status: str) -> None:
    row = {"id": "runtime.pd.prefill", "status": status, "reason": "why"}
    with pytest.raises(werk.InvalidRequest, match="status"):
        decode(encode(row), CapabilityReport)


def test_non_supported_row_needs_a_reason() -> None:
    with pytest.raises(werk.InvalidRequest, match="reason"):
        decode(b'{"id": "runtime.pd.prefill", "status": "unavailable"}', CapabilityReport)
    row = decode(b'{"id": "runtime.pd.prefill", "status": "supported"}', CapabilityReport)
    assert row.reason is None


@pytest.mark.parametrize("cap_id", ["runtime.bogus", "Runtime.pd", "nodot", "a." + "b" * 130])
def test_invalid_capability_ids_are_rejected(cap_id: str) -> None:
    with pytest.raises(werk.InvalidRequest):
        decode(encode({"id": cap_id, "status": "supported"}), CapabilityReport)


# -- decode parameters ---------------------------------------------------------------------------

TOKEN = "wh_" + "A" * 16


@pytest.mark.parametrize("max_tokens", [0, -1, 65_537])
def test_max_tokens_out_of_range(max_tokens: int) -> None:
    with pytest.raises(werk.InvalidRequest, match="max_tokens"):
        decode(encode({"handoff": TOKEN, "max_tokens": max_tokens}), DecodeRequest)


@pytest.mark.parametrize("max_tokens", [1, 65_536])
def test_max_tokens_in_range(max_tokens: int) -> None:
    body = {"handoff": TOKEN, "max_tokens": max_tokens}
    assert decode(encode(body), DecodeRequest).max_tokens == max_tokens


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"null"])
def test_temperature_cannot_be_nan_or_infinite(literal: bytes) -> None:
    body = b'{"handoff": "' + TOKEN.encode() + b'", "temperature": ' + literal + b"}"
    with pytest.raises(werk.InvalidRequest):
        decode(body, DecodeRequest)


def test_encoding_nan_cannot_smuggle_it_through_json() -> None:
    body = encode({"handoff": TOKEN, "temperature": math.nan})
    with pytest.raises(werk.InvalidRequest, match="temperature"):
        decode(body, DecodeRequest)


@pytest.mark.parametrize("temperature", [-0.1, 2.0000001, 3])
def test_temperature_out_of_range(temperature: float) -> None:
    with pytest.raises(werk.InvalidRequest, match="temperature"):
        decode(encode({"handoff": TOKEN, "temperature": temperature}), DecodeRequest)


@pytest.mark.parametrize("temperature", [0, 0.7, 2])
def test_temperature_in_range(temperature: float) -> None:
    body = {"handoff": TOKEN, "temperature": temperature}
    assert decode(encode(body), DecodeRequest).temperature == temperature


def test_stop_sequences_are_bounded() -> None:
    with pytest.raises(werk.InvalidRequest, match="stop"):
        decode(encode({"handoff": TOKEN, "stop": ["x"] * 17}), DecodeRequest)
    with pytest.raises(werk.InvalidRequest, match="stop"):
        decode(encode({"handoff": TOKEN, "stop": [""]}), DecodeRequest)


# -- handoff tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    ["wh_" + "a" * 16, "wh_" + "Z9_-" * 32, "wh_" + "x" * 128],
    ids=["shortest", "alphabet", "longest"],
)
def test_handoff_token_pattern_accepts(token: str) -> None:
    assert decode(encode({"handoff": token}), DecodeRequest).handoff == token


@pytest.mark.parametrize(
    "token",
    [
        "wh_" + "a" * 15,
        "wh_" + "a" * 129,
        "st_" + "a" * 20,
        "WH_" + "a" * 20,
        "wh_" + "a" * 19 + "!",
        "wh_" + "a" * 19 + "é",
        " wh_" + "a" * 20,
        "",
    ],
    ids=[
        "too-short",
        "too-long",
        "wrong-prefix",
        "upper-prefix",
        "punct",
        "non-ascii",
        "space",
        "empty",
    ],
)
def test_handoff_token_pattern_rejects(token: str) -> None:
    with pytest.raises(werk.InvalidRequest, match="handoff"):
        decode(encode({"handoff": token}), DecodeRequest)


# -- prefill -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"model": "demo"},
        {"model": "demo", "prompt": None, "messages": None},
        {"model": "demo", "prompt": "hi", "messages": [{"role": "user", "content": "hi"}]},
    ],
    ids=["neither", "both-null", "both"],
)
def test_prefill_needs_exactly_one_of_prompt_and_messages(body: dict[str, Any]) -> None:
    with pytest.raises(werk.InvalidRequest, match="exactly one of 'prompt' or 'messages'"):
        decode(encode(body), PrefillRequest)


def test_prefill_with_prompt_or_messages_is_accepted() -> None:
    by_prompt = decode(b'{"model": "demo", "prompt": ""}', PrefillRequest)
    assert by_prompt.prompt == "" and by_prompt.messages is None
    body = {"model": "demo", "messages": [{"role": "system", "content": "be brief"}]}
    by_messages = decode(encode(body), PrefillRequest)
    assert by_messages.prompt is None and by_messages.messages is not None


@pytest.mark.parametrize(
    "body",
    [
        {"model": "", "prompt": "x"},
        {"model": "m" * 129, "prompt": "x"},
        {"model": "demo", "messages": []},
        {"model": "demo", "messages": [{"role": "robot", "content": "x"}]},
        {"model": "demo", "prompt": "x", "allow_experimental": "yes"},
    ],
    ids=["empty-model", "long-model", "no-messages", "bad-role", "bool-as-string"],
)
def test_prefill_out_of_range_values_are_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(werk.InvalidRequest):
        decode(encode(body), PrefillRequest)


def test_prefill_absent_policy_differs_from_present_policy() -> None:
    absent = decode(b'{"model": "demo", "prompt": "x"}', PrefillRequest)
    assert absent.policy is msgspec.UNSET and absent.allow_experimental is msgspec.UNSET
    present = decode(
        b'{"model": "demo", "prompt": "x", "policy": {}, "allow_experimental": false}',
        PrefillRequest,
    )
    assert present.policy == Policy() and present.allow_experimental is False


# -- prune ---------------------------------------------------------------------------------------

STATE_ID = "st_" + "a" * 12


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"filter": {}}, "empty prune filter"),
        ({"filter": {"model": None, "tier": None}}, "empty prune filter"),
        ({}, "exactly one of"),
        ({"dry_run": False}, "exactly one of"),
        ({"ids": [STATE_ID], "filter": {"model": "demo"}}, "exactly one of"),
        ({"ids": [STATE_ID], "all": True, "confirm": "all"}, "exactly one of"),
        ({"filter": {"expired": True}, "all": True, "confirm": "all"}, "exactly one of"),
        ({"all": True}, "confirm: all"),
        ({"all": True, "confirm": None}, "confirm: all"),
        ({"all": False, "confirm": "all"}, "'all' must be true"),
        ({"ids": [STATE_ID], "confirm": "all"}, "only valid together with 'all'"),
        ({"filter": {"model": "demo"}, "confirm": "all"}, "only valid together with 'all'"),
    ],
    ids=[
        "empty-filter",
        "null-filter",
        "no-selector",
        "dry-run-only",
        "ids+filter",
        "ids+all",
        "filter+all",
        "all-without-confirm",
        "all-null-confirm",
        "all-false",
        "confirm-with-ids",
        "confirm-with-filter",
    ],
)
def test_prune_selector_rules(body: dict[str, Any], message: str) -> None:
    with pytest.raises(werk.InvalidRequest, match=message):
        decode(encode(body), PruneRequest)


@pytest.mark.parametrize(
    "body",
    [
        {"confirm": "yes", "all": True},
        {"ids": []},
        {"ids": ["not-a-state-id"]},
        {"ids": [STATE_ID] * 1025},
        {"filter": {"expired": False}},
        {"filter": {"older_than_seconds": -1}},
        {"filter": {"tier": "tape"}},
    ],
    ids=[
        "confirm-word",
        "no-ids",
        "bad-id",
        "too-many-ids",
        "expired-false",
        "negative-age",
        "bad-tier",
    ],
)
def test_prune_out_of_range_values(body: dict[str, Any]) -> None:
    with pytest.raises(werk.InvalidRequest):
        decode(encode(body), PruneRequest)


def test_prune_valid_selectors_and_dry_run_default() -> None:
    by_ids = decode(encode({"ids": [STATE_ID]}), PruneRequest)
    by_filter = decode(encode({"filter": {"tier": "disk"}}), PruneRequest)
    everything = decode(encode({"all": True, "confirm": "all"}), PruneRequest)
    assert by_ids.ids == [STATE_ID]
    assert by_filter.filter == PruneFilter(tier=protocol.Tier.DISK)
    assert everything.all is True
    assert by_ids.dry_run and by_filter.dry_run and everything.dry_run


def test_mutation_requests_preview_by_default() -> None:
    assert decode(b'{"pinned": true}', protocol.PinRequest).dry_run is True
    assert decode(b'{"target": "disk"}', protocol.TierRequest).dry_run is True
    experts = decode(b'{"experts": ["e0"]}', protocol.ExpertActionRequest)
    assert experts.dry_run is True and experts.allow_experimental is False


def test_expert_action_uses_the_wire_name_from() -> None:
    action = protocol.ExpertAction(
        id="e1", from_=protocol.ExpertTier.RAM, to=protocol.ExpertTier.VRAM
    )
    assert msgspec.json.decode(encode(action)) == {"id": "e1", "from": "ram", "to": "vram"}


@pytest.mark.parametrize("cap_id", ["a.b", "llamacpp.slots", "x-y.z_1", "runtime.pd.handoff"])
def test_plugin_and_core_capability_ids_are_accepted(cap_id: str) -> None:
    assert protocol.validate_capability_id(cap_id) == cap_id
