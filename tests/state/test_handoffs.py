"""Handoff registry bounds and rules, and the 1 MiB completion-text bound."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator

import pytest

import werk
from werk.protocol import MAX_COMPLETION_BYTES, DecodeRequest, decode
from werk.state.envelope import Envelope
from werk.state.handoffs import (
    HANDOFF_TTL_SECONDS,
    MAX_LIVE_PER_PRINCIPAL,
    MAX_LIVE_TOTAL,
    CompletionBuffer,
    HandoffBinding,
    HandoffRegistry,
    IssuedHandoff,
    bound_completion_text,
)
from werk.state.principals import LOCAL_PRINCIPAL, NamespaceKey, principal_for_api_key

KEY = NamespaceKey.ephemeral()
ALICE = principal_for_api_key(KEY, "sk-alice")
BOB = principal_for_api_key(KEY, "sk-bob")
GEN = "gen-1"


class Clock:
    """An injected clock: tests move time explicitly, nothing sleeps."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def envelope(principal: str, generation: str = GEN) -> Envelope:
    return Envelope(
        adapter="werk-test",
        adapter_version="1.0",
        backend="test",
        executable="",
        model_identity="sha256:" + "1" * 64,
        runtime_args=("--ctx", "512"),
        cache_layout="test/v1",
        generation=generation,
        principal=principal,
    )


def binding(principal: str, generation: str = GEN, state_id: str | None = None) -> HandoffBinding:
    return HandoffBinding(
        envelope=envelope(principal, generation), payload=object(), state_id=state_id
    )


def issue(reg: HandoffRegistry, principal: str, **kw: str) -> IssuedHandoff:
    return reg.reserve(principal).issue(binding(principal, **kw))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reg(clock: Clock) -> HandoffRegistry:
    return HandoffRegistry(KEY, clock=clock)


def principals(n: int) -> Iterator[str]:
    for i in range(n):
        yield principal_for_api_key(KEY, f"sk-{i}")


def assert_exhausted(exc: pytest.ExceptionInfo[werk.ResourceExhausted]) -> None:
    assert exc.value.retryable is True
    assert exc.value.http_status == 429
    assert exc.value.code == werk.ErrorCode.RESOURCE_EXHAUSTED


# --- tokens -------------------------------------------------------------------------------


def test_token_shape_and_wire_form(reg: HandoffRegistry, clock: Clock) -> None:
    token, expires_at = issue(reg, ALICE)
    assert re.fullmatch(r"wh_[A-Za-z0-9_-]{16,128}", token)
    assert decode(f'{{"handoff": "{token}"}}', DecodeRequest).handoff == token
    assert expires_at == clock.now + HANDOFF_TTL_SECONDS
    issued = IssuedHandoff(token, expires_at)
    assert token not in repr(issued)
    wire = issued.to_protocol()
    assert wire.token == token and wire.expires_at.endswith("Z")
    # Only the hash is stored: the token text appears nowhere in the registry's state.
    assert token not in repr(vars(reg)) and token not in repr(list(reg._slots.values()))


def test_tokens_are_unique(reg: HandoffRegistry) -> None:
    tokens = {issue(reg, ALICE).token for _ in range(MAX_LIVE_PER_PRINCIPAL)}
    assert len(tokens) == MAX_LIVE_PER_PRINCIPAL


# --- bounds -------------------------------------------------------------------------------


def test_128_per_principal_then_429_without_eviction(reg: HandoffRegistry) -> None:
    tokens = [issue(reg, ALICE).token for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    with pytest.raises(werk.ResourceExhausted) as exc:
        reg.reserve(ALICE)
    assert_exhausted(exc)
    assert reg.occupied(ALICE) == MAX_LIVE_PER_PRINCIPAL
    # Another principal is unaffected by Alice's bound.
    issue(reg, BOB)
    # No eviction: every one of Alice's 128 tokens is still consumable.
    for token in tokens:
        reg.consume(ALICE, token, generation=GEN).release()
    assert reg.occupied(ALICE) == 0
    issue(reg, ALICE)  # capacity came back by use, not by eviction


def test_1024_total_across_principals_then_429_without_eviction(reg: HandoffRegistry) -> None:
    owners = list(principals(MAX_LIVE_TOTAL // MAX_LIVE_PER_PRINCIPAL))  # 8 principals x 128
    issued = [(p, issue(reg, p).token) for p in owners for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    assert reg.occupied() == MAX_LIVE_TOTAL
    with pytest.raises(werk.ResourceExhausted) as exc:
        reg.reserve(LOCAL_PRINCIPAL)  # a fresh principal, far below its own bound
    assert_exhausted(exc)
    assert "full" in exc.value.message
    for principal, token in issued:
        reg.consume(principal, token, generation=GEN).release()
    assert reg.occupied() == 0


def test_reservations_and_held_slots_count_against_bounds(reg: HandoffRegistry) -> None:
    reservations = [reg.reserve(ALICE) for _ in range(MAX_LIVE_PER_PRINCIPAL - 1)]
    token = issue(reg, ALICE).token  # the 128th slot
    held = reg.consume(ALICE, token, generation=GEN)
    with pytest.raises(werk.ResourceExhausted):
        reg.reserve(ALICE)
    held.release()
    reg.reserve(ALICE).rollback()
    for r in reservations:
        r.rollback()
    assert reg.occupied(ALICE) == 0


def test_expired_records_are_purged_before_the_bound_check(
    reg: HandoffRegistry, clock: Clock
) -> None:
    owners = list(principals(MAX_LIVE_TOTAL // MAX_LIVE_PER_PRINCIPAL))
    for p in owners[:-1]:
        for _ in range(MAX_LIVE_PER_PRINCIPAL):
            issue(reg, p)
    clock.now += 60
    fresh = [issue(reg, owners[-1]).token for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    with pytest.raises(werk.ResourceExhausted):
        reg.reserve(BOB)
    # The first 896 expire; the last 128 (issued a minute later) are still valid.
    clock.now += HANDOFF_TTL_SECONDS - 60
    assert reg.occupied() == MAX_LIVE_PER_PRINCIPAL
    for _ in range(MAX_LIVE_PER_PRINCIPAL):
        issue(reg, BOB)  # admitted: expired records were purged first
    for token in fresh:  # and no valid record was evicted to make room
        reg.consume(owners[-1], token, generation=GEN).release()


def test_per_principal_purge_first(reg: HandoffRegistry, clock: Clock) -> None:
    for _ in range(MAX_LIVE_PER_PRINCIPAL):
        issue(reg, ALICE)
    clock.now += HANDOFF_TTL_SECONDS
    reg.reserve(ALICE).rollback()  # all 128 expired exactly now, so there is room


# --- expiry -------------------------------------------------------------------------------


def test_expiry_is_exactly_15_minutes(reg: HandoffRegistry, clock: Clock) -> None:
    start = clock.now
    almost, _ = issue(reg, ALICE)
    expired, expires_at = issue(reg, ALICE)
    assert expires_at - start == 15 * 60
    clock.now = start + HANDOFF_TTL_SECONDS - 0.001
    reg.consume(ALICE, almost, generation=GEN).release()  # valid until the last instant
    clock.now = start + HANDOFF_TTL_SECONDS
    with pytest.raises(werk.InvalidHandoff):
        reg.consume(ALICE, expired, generation=GEN)
    assert reg.occupied() == 0


def test_expiry_starts_at_issue_not_reserve(reg: HandoffRegistry, clock: Clock) -> None:
    reservation = reg.reserve(ALICE)
    clock.now += 600  # slow prefill
    token, expires_at = reservation.issue(binding(ALICE))
    assert expires_at == clock.now + HANDOFF_TTL_SECONDS
    clock.now += HANDOFF_TTL_SECONDS - 1
    reg.consume(ALICE, token, generation=GEN).release()


def test_unsettled_slots_lapse(reg: HandoffRegistry, clock: Clock) -> None:
    """A leaked reservation or hold cannot pin capacity forever."""
    leaked = [reg.reserve(ALICE) for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    with pytest.raises(werk.ResourceExhausted):
        reg.reserve(ALICE)
    clock.now += HANDOFF_TTL_SECONDS
    taken = reg.reserve(ALICE)
    assert reg.occupied(ALICE) == 1
    # Settling a lapsed reservation re-admits it under the bounds (room exists here).
    token, _ = leaked[0].issue(binding(ALICE))
    leaked[1].rollback()  # rolling back a lapsed one is harmless
    assert reg.occupied(ALICE) == 2
    reg.consume(ALICE, token, generation=GEN).release()
    taken.rollback()


# --- consume ------------------------------------------------------------------------------


def test_single_use_even_after_a_failed_decode(reg: HandoffRegistry) -> None:
    token, _ = issue(reg, ALICE)
    consumed = reg.consume(ALICE, token, generation=GEN)
    with pytest.raises(RuntimeError), consumed:  # the backend call fails mid-decode
        raise RuntimeError("backend crashed")
    with pytest.raises(werk.InvalidHandoff) as exc:
        reg.consume(ALICE, token, generation=GEN)
    assert exc.value.http_status == 410
    assert reg.occupied() == 0  # the held slot was released on the way out


def test_every_invalid_case_has_the_same_message(reg: HandoffRegistry, clock: Clock) -> None:
    messages = set()
    used, _ = issue(reg, ALICE)
    reg.consume(ALICE, used, generation=GEN).release()
    expired, _ = issue(reg, ALICE)
    clock.now += HANDOFF_TTL_SECONDS
    cross, _ = issue(reg, ALICE)
    other_gen, _ = issue(reg, ALICE)
    cases = [
        (ALICE, "wh_" + "A" * 43, GEN),  # unknown
        (ALICE, used, GEN),  # already consumed
        (ALICE, expired, GEN),  # expired
        (BOB, cross, GEN),  # another principal
        (ALICE, other_gen, "gen-2"),  # another process generation
    ]
    for principal, token, gen in cases:
        with pytest.raises(werk.InvalidHandoff) as exc:
            reg.consume(principal, token, generation=gen)
        messages.add(exc.value.message)
        assert token not in exc.value.message
    assert len(messages) == 1


def test_cross_principal_use_is_invalid_and_does_not_burn_the_token(
    reg: HandoffRegistry,
) -> None:
    token, _ = issue(reg, ALICE)
    for thief in (BOB, LOCAL_PRINCIPAL):
        with pytest.raises(werk.InvalidHandoff):
            reg.consume(thief, token, generation=GEN)
    consumed = reg.consume(ALICE, token, generation=GEN)  # the owner can still use it
    assert consumed.binding.envelope.principal == ALICE
    consumed.release()


def test_other_generation_is_invalid_and_frees_the_slot(reg: HandoffRegistry) -> None:
    token, _ = issue(reg, ALICE, generation="gen-old")
    with pytest.raises(werk.InvalidHandoff):
        reg.consume(ALICE, token, generation="gen-new")
    assert reg.occupied() == 0  # a dead generation never comes back
    with pytest.raises(werk.InvalidHandoff):
        reg.consume(ALICE, token, generation="gen-old")
    # A set of live generations is accepted too.
    token, _ = issue(reg, ALICE, generation="gen-b")
    reg.consume(ALICE, token, generation=frozenset({"gen-a", "gen-b"})).release()


def test_drop_generation(reg: HandoffRegistry) -> None:
    dead, _ = issue(reg, ALICE, generation="gen-dead")
    alive, _ = issue(reg, ALICE, generation=GEN)
    assert reg.drop_generation("gen-dead") == 1
    with pytest.raises(werk.InvalidHandoff):
        reg.consume(ALICE, dead, generation="gen-dead")
    reg.consume(ALICE, alive, generation=GEN).release()
    old, _ = issue(reg, ALICE, generation="gen-a")
    keep, _ = issue(reg, ALICE, generation="gen-b")
    held = reg.consume(ALICE, issue(reg, ALICE, generation="gen-a").token, generation="gen-a")
    assert reg.drop_generations(frozenset({"gen-b"})) == 1  # holds stay with their owner
    with pytest.raises(werk.InvalidHandoff):
        reg.consume(ALICE, old, generation="gen-a")
    reg.consume(ALICE, keep, generation="gen-b").release()
    held.release()
    assert reg.occupied() == 0


def test_consumed_slot_is_held_for_a_replacement(reg: HandoffRegistry) -> None:
    tokens = [issue(reg, ALICE).token for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    with reg.consume(ALICE, tokens[0], generation=GEN) as consumed:
        # Another request cannot steal the held slot during decode.
        with pytest.raises(werk.ResourceExhausted):
            reg.reserve(ALICE)
        new_token, _ = consumed.replace(binding(ALICE, state_id="st_next"))
    assert reg.occupied(ALICE) == MAX_LIVE_PER_PRINCIPAL  # the slot moved, nothing freed
    assert new_token != tokens[0]
    assert reg.live_for(ALICE, "st_next")
    reg.consume(ALICE, new_token, generation=GEN).release()
    with pytest.raises(werk.InternalError):
        consumed.replace(binding(ALICE))  # a slot is settled once


def test_release_when_no_replacement(reg: HandoffRegistry) -> None:
    token, _ = issue(reg, ALICE)
    consumed = reg.consume(ALICE, token, generation=GEN)
    assert reg.occupied(ALICE) == 1
    consumed.release()
    consumed.release()  # idempotent
    assert reg.occupied(ALICE) == 0


def test_replacement_must_stay_with_the_principal(reg: HandoffRegistry) -> None:
    token, _ = issue(reg, ALICE)
    with reg.consume(ALICE, token, generation=GEN) as consumed, pytest.raises(werk.InternalError):
        consumed.replace(binding(BOB))
    assert reg.occupied() == 0


def test_concurrent_consume_has_exactly_one_winner(reg: HandoffRegistry) -> None:
    token, _ = issue(reg, ALICE)
    barrier = threading.Barrier(16)
    wins: list[int] = []
    losses: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            reg.consume(ALICE, token, generation=GEN)
        except werk.InvalidHandoff:
            losses.append(i)
        else:
            wins.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1 and len(losses) == 15


def test_concurrent_reserve_never_exceeds_the_bound(reg: HandoffRegistry) -> None:
    barrier = threading.Barrier(8)
    got: list[int] = []
    refused: list[int] = []

    def grab() -> None:
        barrier.wait()
        for _ in range(40):
            try:
                reg.reserve(ALICE)
            except werk.ResourceExhausted:
                refused.append(1)
            else:
                got.append(1)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == MAX_LIVE_PER_PRINCIPAL and len(refused) == 8 * 40 - MAX_LIVE_PER_PRINCIPAL


# --- prefill rollback ---------------------------------------------------------------------


def test_rollback_frees_the_slot(reg: HandoffRegistry) -> None:
    reservations = [reg.reserve(ALICE) for _ in range(MAX_LIVE_PER_PRINCIPAL)]
    with pytest.raises(werk.ResourceExhausted):
        reg.reserve(ALICE)
    reservations[0].rollback()  # that prefill failed
    reservations[0].rollback()  # idempotent
    reg.reserve(ALICE)  # the slot is usable again
    with pytest.raises(werk.InternalError):
        reservations[0].issue(binding(ALICE))  # a rolled-back reservation cannot issue


def test_exception_in_prefill_rolls_back(reg: HandoffRegistry) -> None:
    with pytest.raises(werk.BackendError), reg.reserve(ALICE):
        assert reg.occupied(ALICE) == 1
        raise werk.BackendError("backend failed during prefill")
    assert reg.occupied(ALICE) == 0


def test_context_manager_keeps_an_issued_handoff(reg: HandoffRegistry) -> None:
    with reg.reserve(ALICE) as reservation:
        token, _ = reservation.issue(binding(ALICE, state_id="st_1"))
    assert reg.occupied(ALICE) == 1 and reg.live_for(ALICE, "st_1")
    assert not reg.live_for(BOB, "st_1")
    with pytest.raises(werk.InternalError):
        reservation.issue(binding(ALICE))  # issued once only
    reg.consume(ALICE, token, generation=GEN).release()
    assert not reg.live_for(ALICE, "st_1")


def test_live_for_sees_in_use_handoffs_and_ignores_expired(
    reg: HandoffRegistry, clock: Clock
) -> None:
    token, _ = issue(reg, ALICE, state_id="st_busy")
    held = reg.consume(ALICE, token, generation=GEN)
    assert reg.live_state_ids(ALICE) == {"st_busy"}  # decode running: still in use
    held.release()
    issue(reg, ALICE, state_id="st_old")
    clock.now += HANDOFF_TTL_SECONDS
    assert not reg.live_for(ALICE, "st_old")


def test_rejects_malformed_principal(reg: HandoffRegistry) -> None:
    with pytest.raises(ValueError):
        reg.reserve("alice")


# --- completion text bound ----------------------------------------------------------------


def test_completion_bound_is_exactly_1_mib() -> None:
    assert MAX_COMPLETION_BYTES == 1024 * 1024
    exact = "a" * MAX_COMPLETION_BYTES
    assert bound_completion_text(exact) is exact
    with pytest.raises(werk.BackendError) as exc:
        bound_completion_text(exact + "a")
    assert exc.value.http_status == 502


def test_completion_bound_counts_utf8_bytes_not_characters() -> None:
    euro = "€"  # 3 bytes in UTF-8
    fits = euro * (MAX_COMPLETION_BYTES // 3) + "a" * (MAX_COMPLETION_BYTES % 3)
    assert len(fits.encode()) == MAX_COMPLETION_BYTES
    bound_completion_text(fits)
    over = euro * (MAX_COMPLETION_BYTES // 3 + 1)  # fewer characters than the limit
    assert len(over) < MAX_COMPLETION_BYTES < len(over.encode())
    with pytest.raises(werk.BackendError):
        bound_completion_text(over)
    with pytest.raises(werk.BackendError):
        bound_completion_text("\ud800")  # a lone surrogate is not UTF-8 text


def test_streaming_buffer_stops_at_the_bound() -> None:
    buf = CompletionBuffer()
    chunk = "😀" * 1024  # 4 KiB per chunk
    for _ in range(MAX_COMPLETION_BYTES // 4096):
        buf.append(chunk)
    assert buf.byte_length == MAX_COMPLETION_BYTES  # exactly 1 MiB is fine
    with pytest.raises(werk.BackendError):
        buf.append("x")  # one more byte crosses the bound
    assert buf.byte_length == MAX_COMPLETION_BYTES  # the offending chunk was not stored
    with pytest.raises(werk.BackendError):
        buf.append("")  # the buffer stays failed
    assert len(buf.text().encode()) == MAX_COMPLETION_BYTES


def test_streaming_buffer_boundary_small() -> None:
    fits = CompletionBuffer(limit=10)
    fits.extend(["abc", "défg", "é"])  # 3 + 5 + 2 == 10 bytes: exactly the bound
    assert fits.text() == "abcdéfgé" and fits.byte_length == 10
    over = CompletionBuffer(limit=10)
    over.extend(["abc", "défg"])
    with pytest.raises(werk.BackendError):
        over.append("€")  # 8 + 3 > 10
    assert over.text() == "abcdéfg"


def test_generations_in_use_are_those_of_live_and_held_handoffs(
    reg: HandoffRegistry, clock: Clock
) -> None:
    assert reg.generations_in_use() == frozenset()
    issued = issue(reg, ALICE, generation="g_a")
    issue(reg, BOB, generation="g_b")
    pending = reg.reserve(BOB)  # a reservation binds no generation yet
    assert reg.generations_in_use() == {"g_a", "g_b"}
    with reg.consume(ALICE, issued.token, generation={"g_a", "g_b"}):
        assert reg.generations_in_use() == {"g_a", "g_b"}  # held while its decode runs
    assert reg.generations_in_use() == {"g_b"}
    pending.rollback()
    clock.now += HANDOFF_TTL_SECONDS
    assert reg.generations_in_use() == frozenset()  # expired: protects nothing
