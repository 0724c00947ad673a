"""Effective Prefill policy, retention tier resolution and reuse decisions."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import werk
from werk.protocol import (
    CapabilityId,
    CapabilityStatus,
    PersistenceDefaults,
    Policy,
    PrefillRequest,
    Retention,
    Reuse,
    ReuseOutcome,
    Tier,
    decode,
)
from werk.state.envelope import Envelope
from werk.state.policy import (
    EffectivePrefill,
    Lookup,
    classify_candidates,
    decide_reuse,
    effective_prefill_policy,
    resolve_retention,
)

S = CapabilityStatus
DISK = CapabilityId.STATE_TIER_DISK
PERSIST = CapabilityId.STATE_PERSISTENCE
RAM = CapabilityId.STATE_TIER_RAM
VRAM = CapabilityId.STATE_TIER_VRAM
SERVER = PersistenceDefaults(retention=Retention.DISK, reuse=Reuse.REQUIRED, ttl_seconds=60)


def prefill(body: str) -> PrefillRequest:
    return decode(body, PrefillRequest)


# --- defaults -----------------------------------------------------------------------------


def test_absent_policy_without_server_defaults_is_the_protocol_default() -> None:
    eff = effective_prefill_policy(prefill('{"model": "m", "prompt": "x"}'), None)
    assert eff == EffectivePrefill(Policy(), False)
    assert eff.policy.retention is Retention.EPHEMERAL and eff.policy.reuse is Reuse.DISABLED


def test_absent_policy_takes_server_defaults() -> None:
    policy, allow = effective_prefill_policy(prefill('{"model": "m", "prompt": "x"}'), SERVER)
    assert policy == Policy(retention=Retention.DISK, reuse=Reuse.REQUIRED, ttl_seconds=60)
    assert allow is True  # --persistence supplies the opt-in when it is omitted


def test_present_policy_is_complete_and_not_merged() -> None:
    """An empty policy object means protocol defaults, not the server's."""
    for body in ('{"policy": {}}', '{"policy": {"reuse": "prefer"}}'):
        req = prefill('{"model": "m", "prompt": "x", ' + body[1:])
        policy, _ = effective_prefill_policy(req, SERVER)
        assert policy.retention is Retention.EPHEMERAL  # not the server's "disk"
        assert policy.ttl_seconds is None  # not the server's 60
    req = prefill('{"model": "m", "prompt": "x", "policy": {"reuse": "prefer"}}')
    assert effective_prefill_policy(req, SERVER).policy.reuse is Reuse.PREFER


def test_explicit_false_is_never_promoted() -> None:
    req = prefill('{"model": "m", "prompt": "x", "allow_experimental": false}')
    assert effective_prefill_policy(req, SERVER).allow_experimental is False
    assert effective_prefill_policy(req, None).allow_experimental is False
    req = prefill('{"model": "m", "prompt": "x", "allow_experimental": true}')
    assert effective_prefill_policy(req, None).allow_experimental is True
    no_optin = PersistenceDefaults(allow_experimental=False)
    req = prefill('{"model": "m", "prompt": "x"}')
    assert effective_prefill_policy(req, no_optin).allow_experimental is False


@given(
    policy=st.one_of(
        st.none(),
        st.builds(
            Policy,
            retention=st.sampled_from(Retention),
            reuse=st.sampled_from(Reuse),
            ttl_seconds=st.one_of(st.none(), st.integers(1, 2_592_000)),
            pin=st.booleans(),
        ),
    ),
    allow=st.one_of(st.none(), st.booleans()),
    defaults=st.one_of(st.none(), st.builds(PersistenceDefaults, allow_experimental=st.booleans())),
)
def test_present_members_always_win(
    policy: Policy | None, allow: bool | None, defaults: PersistenceDefaults | None
) -> None:
    kwargs: dict[str, object] = {"model": "m", "prompt": "x"}
    if policy is not None:
        kwargs["policy"] = policy
    if allow is not None:
        kwargs["allow_experimental"] = allow
    eff = effective_prefill_policy(PrefillRequest(**kwargs), defaults)  # type: ignore[arg-type]
    if policy is not None:
        assert eff.policy is policy
    else:
        assert eff.policy == (defaults.policy() if defaults else Policy())
    if allow is not None:
        assert eff.allow_experimental is allow
    else:
        assert eff.allow_experimental is (defaults.allow_experimental if defaults else False)


# --- retention ----------------------------------------------------------------------------


def pol(retention: Retention) -> Policy:
    return Policy(retention=retention)


def test_ephemeral_creates_no_named_state() -> None:
    all_supported = {c: S.SUPPORTED for c in (DISK, PERSIST, RAM, VRAM)}
    assert resolve_retention(pol(Retention.EPHEMERAL), all_supported, allow_experimental=True) is (
        None
    )


def test_auto_prefers_disk_else_backend() -> None:
    disk_ok = {DISK: S.SUPPORTED, PERSIST: S.SUPPORTED}
    assert resolve_retention(pol(Retention.AUTO), disk_ok, allow_experimental=False) is Tier.DISK
    for statuses in ({}, {DISK: S.SUPPORTED}, {PERSIST: S.SUPPORTED, DISK: S.UNAVAILABLE}):
        got = resolve_retention(pol(Retention.AUTO), statuses, allow_experimental=False)
        assert got is Tier.BACKEND


def test_auto_uses_experimental_disk_only_with_opt_in() -> None:
    exp = {DISK: S.EXPERIMENTAL, PERSIST: S.EXPERIMENTAL}
    assert resolve_retention(pol(Retention.AUTO), exp, allow_experimental=True) is Tier.DISK
    assert resolve_retention(pol(Retention.AUTO), exp, allow_experimental=False) is Tier.BACKEND


@pytest.mark.parametrize(
    ("statuses", "error", "capability"),
    [
        ({}, werk.Unsupported, PERSIST),
        ({PERSIST: S.SUPPORTED}, werk.Unsupported, DISK),
        ({PERSIST: S.SUPPORTED, DISK: S.UNSUPPORTED}, werk.Unsupported, DISK),
        ({PERSIST: S.SUPPORTED, DISK: S.METADATA_ONLY}, werk.Unsupported, DISK),
        ({PERSIST: S.UNAVAILABLE, DISK: S.SUPPORTED}, werk.Unavailable, PERSIST),
        ({PERSIST: S.SUPPORTED, DISK: S.EXPERIMENTAL}, werk.ExperimentalOptInRequired, DISK),
    ],
)
def test_disk_fails_instead_of_weakening(
    statuses: dict[str, CapabilityStatus], error: type[werk.WerkError], capability: str
) -> None:
    with pytest.raises(error) as exc:
        resolve_retention(pol(Retention.DISK), statuses, allow_experimental=False)
    assert exc.value.capability == capability


def test_disk_with_opt_in_accepts_experimental() -> None:
    exp = {DISK: S.EXPERIMENTAL, PERSIST: S.SUPPORTED}
    assert resolve_retention(pol(Retention.DISK), exp, allow_experimental=True) is Tier.DISK


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        ({RAM: S.SUPPORTED, VRAM: S.SUPPORTED}, Tier.RAM),
        ({VRAM: S.SUPPORTED}, Tier.VRAM),
        ({RAM: S.UNAVAILABLE, VRAM: S.SUPPORTED}, Tier.VRAM),
    ],
)
def test_memory_picks_an_operational_tier(
    statuses: dict[str, CapabilityStatus], expected: Tier
) -> None:
    assert resolve_retention(pol(Retention.MEMORY), statuses, allow_experimental=False) is expected


@pytest.mark.parametrize(
    ("statuses", "error", "capability"),
    [
        ({DISK: S.SUPPORTED, PERSIST: S.SUPPORTED}, werk.Unsupported, RAM),  # disk is no RAM
        ({RAM: S.UNSUPPORTED, VRAM: S.UNAVAILABLE}, werk.Unavailable, VRAM),
        ({RAM: S.EXPERIMENTAL, VRAM: S.UNAVAILABLE}, werk.ExperimentalOptInRequired, RAM),
    ],
)
def test_memory_fails_instead_of_weakening(
    statuses: dict[str, CapabilityStatus], error: type[werk.WerkError], capability: str
) -> None:
    with pytest.raises(error) as exc:
        resolve_retention(pol(Retention.MEMORY), statuses, allow_experimental=False)
    assert exc.value.capability == capability


@given(
    retention=st.sampled_from([Retention.MEMORY, Retention.DISK]),
    statuses=st.dictionaries(st.sampled_from([DISK, PERSIST, RAM, VRAM]), st.sampled_from(S)),
    allow=st.booleans(),
)
def test_memory_and_disk_never_weaken(
    retention: Retention, statuses: dict[str, CapabilityStatus], allow: bool
) -> None:
    """Whatever the adapter reports, the answer is the requested kind of tier or an error."""
    try:
        tier = resolve_retention(pol(retention), statuses, allow_experimental=allow)
    except (werk.Unsupported, werk.Unavailable, werk.ExperimentalOptInRequired) as exc:
        assert exc.capability is not None
        return
    allowed = {Retention.MEMORY: {Tier.RAM, Tier.VRAM}, Retention.DISK: {Tier.DISK}}[retention]
    assert tier in allowed


# --- reuse --------------------------------------------------------------------------------


def env(**changes: str) -> Envelope:
    base = {
        "adapter": "werk-test",
        "adapter_version": "1",
        "backend": "test",
        "executable": "sha256:" + "a" * 64,
        "model_identity": "sha256:" + "b" * 64,
        "cache_layout": "v1",
        "generation": "gen-1",
        "principal": "local",
    }
    base.update(changes)
    return Envelope(runtime_args=("--ctx", "512"), **base)


def test_classify_distinguishes_miss_from_incompatible() -> None:
    runtime = env()
    assert classify_candidates(runtime, []) is Lookup.MISS
    assert classify_candidates(runtime, [env(generation="gen-0")]) is Lookup.INCOMPATIBLE
    assert classify_candidates(runtime, [env(executable="sha256:" + "c" * 64)]) is (
        Lookup.INCOMPATIBLE
    )
    assert classify_candidates(runtime, [env(generation="gen-0"), env()]) is Lookup.COMPATIBLE


def test_required_never_falls_through() -> None:
    assert decide_reuse(Reuse.REQUIRED, Lookup.COMPATIBLE) is ReuseOutcome.REUSED
    with pytest.raises(werk.ReuseUnavailable) as miss:
        decide_reuse(Reuse.REQUIRED, Lookup.MISS)
    with pytest.raises(werk.IncompatibleState) as incompatible:
        decide_reuse(Reuse.REQUIRED, Lookup.INCOMPATIBLE)
    assert miss.value.http_status == incompatible.value.http_status == 409
    assert miss.value.code != incompatible.value.code


def test_prefer_goes_fresh_on_miss_or_incompatible() -> None:
    assert decide_reuse(Reuse.PREFER, Lookup.COMPATIBLE) is ReuseOutcome.REUSED
    assert decide_reuse(Reuse.PREFER, Lookup.MISS) is ReuseOutcome.FRESH
    assert decide_reuse(Reuse.PREFER, Lookup.INCOMPATIBLE) is ReuseOutcome.FRESH


@pytest.mark.parametrize("lookup", list(Lookup))
def test_disabled_never_reuses(lookup: Lookup) -> None:
    assert decide_reuse(Reuse.DISABLED, lookup) is ReuseOutcome.DISABLED


@given(st.sampled_from(Reuse), st.sampled_from(Lookup))
def test_no_decision_is_fresh_under_required(reuse: Reuse, lookup: Lookup) -> None:
    try:
        outcome = decide_reuse(reuse, lookup)
    except (werk.ReuseUnavailable, werk.IncompatibleState):
        assert reuse is Reuse.REQUIRED
        return
    if reuse is Reuse.REQUIRED:
        assert outcome is ReuseOutcome.REUSED


def test_across_generations_waives_the_generation_and_nothing_else() -> None:
    runtime = env()
    earlier = env(generation="gen-0")
    assert not earlier.compatible_with(runtime)
    assert earlier.compatible_with(runtime, across_generations=True)
    assert earlier.differences(runtime) == ["generation"]
    for changed in (
        env(generation="gen-0", executable="sha256:" + "c" * 64),
        env(generation="gen-0", cache_layout="v2"),
        env(generation="gen-0", principal="p_other"),
        Envelope(**{**msgspec.structs.asdict(earlier), "runtime_args": ("--ctx", "1024")}),
    ):
        assert not changed.compatible_with(runtime, across_generations=True)
        assert "generation" in changed.differences(runtime)
        assert len(changed.differences(runtime)) == 2


@given(
    st.dictionaries(
        st.sampled_from(["adapter", "backend", "executable", "model_identity", "cache_layout"]),
        st.text(min_size=1, max_size=8),
    ),
    st.text(min_size=1, max_size=8),
)
def test_compatibility_across_generations_is_equality_without_the_generation(
    changes: dict[str, str], generation: str
) -> None:
    other = env(generation=generation, **changes)
    same_elsewhere = all(getattr(other, k) == getattr(env(), k) for k in changes)
    assert other.compatible_with(env(), across_generations=True) is same_elsewhere
    assert set(other.differences(env())) <= {"generation", *changes}
