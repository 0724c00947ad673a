"""Prefix fingerprints and the catalog's prefix lookup (the longest shared prefix wins)."""

from __future__ import annotations

from pathlib import Path

from _crash_child import P_OTHER, envelope, fingerprint, payload_chunks
from hypothesis import given
from hypothesis import strategies as st

from werk.protocol.states import Tier
from werk.state.catalog import StateCatalog
from werk.state.metadata import decode_metadata
from werk.state.prefixes import MAX_CHAIN, PREFIX_CHARS, longest_shared, prefix_chain
from werk.state.principals import NamespaceKey

KEY = NamespaceKey.ephemeral()
SYSTEM = ("system", "You keep clocks.")
TURN_1 = [SYSTEM, ("user", "Which clock is oldest?")]
TURN_2 = [*TURN_1, ("assistant", "The tall one."), ("user", "Who winds it?")]


def chain(principal: str = "local", model: str = "demo", **prompt: object) -> list[tuple[int, str]]:
    return prefix_chain(KEY, principal, model=model, **prompt)  # type: ignore[arg-type]


def fingerprints(c: list[tuple[int, str]]) -> list[str]:
    return [f for _, f in c]


def test_a_chat_matches_after_every_message_and_a_state_includes_its_whole_prompt() -> None:
    state = chain(messages=TURN_1, whole=True)
    assert [p for p, _ in state] == [1, 2]
    request = chain(messages=TURN_2)
    assert [p for p, _ in request] == [1, 2, 3]  # the whole of turn 2 is the exact lookup
    assert longest_shared(request, fingerprints(state)) == 2
    other_reply = chain(messages=[*TURN_1, ("assistant", "Another.")], whole=True)
    assert longest_shared(request, fingerprints(other_reply)) == 2  # diverged after turn 1


def test_a_text_prompt_matches_at_the_last_boundary_both_share() -> None:
    first = "a" * 700
    state = chain(prompt=first, whole=True)
    assert [p for p, _ in state] == [PREFIX_CHARS, 2 * PREFIX_CHARS]
    assert longest_shared(chain(prompt=first + "b" * 300), fingerprints(state)) == 512
    diverged = "a" * 300 + "c" * 700
    assert longest_shared(chain(prompt=diverged), fingerprints(state)) == 256
    assert chain(prompt="short") == []  # under one boundary: never a prefix match


def test_fingerprints_are_keyed_by_principal_model_and_namespace() -> None:
    mine = fingerprints(chain(messages=TURN_1, whole=True))
    request = chain(messages=TURN_2)
    assert longest_shared(chain(P_OTHER, messages=TURN_2), mine) == 0
    assert longest_shared(chain(model="other", messages=TURN_2), mine) == 0
    elsewhere = prefix_chain(NamespaceKey.ephemeral(), "local", model="demo", messages=TURN_2)
    assert longest_shared(elsewhere, mine) == 0
    assert longest_shared(request, mine) == 2
    text = " ".join(m for _, m in TURN_1)
    assert all(text not in f and f.startswith("pp_") for f in mine)


def test_a_chain_keeps_the_longest_prefixes_only() -> None:
    long = chain(prompt="x" * (PREFIX_CHARS * (MAX_CHAIN + 10)), whole=True)
    assert len(long) == MAX_CHAIN
    assert long[-1][0] == PREFIX_CHARS * (MAX_CHAIN + 10)


@given(st.text(min_size=1, max_size=1200), st.text(min_size=1, max_size=600))
def test_a_prompt_extending_a_state_shares_its_last_boundary(head: str, tail: str) -> None:
    state = chain(prompt=head, whole=True)
    shared = longest_shared(chain(prompt=head + tail), fingerprints(state))
    assert shared == (len(head) // PREFIX_CHARS) * PREFIX_CHARS


def _commit(
    catalog: StateCatalog, prefixes: list[tuple[int, str]], n: int, principal: str = "local"
):  # type: ignore[no-untyped-def]
    return catalog.commit(
        principal,
        envelope=envelope(principal),
        model="demo",
        backend="test",
        tier=Tier.DISK,
        fingerprint=fingerprint(n),
        payload=iter(payload_chunks(n, 1, 64)),
        ttl_seconds=None,
        pinned=False,
        prefixes=tuple(fingerprints(prefixes)),
    )


def test_the_catalog_finds_the_longest_shared_prefix_of_the_callers_own_states(
    tmp_path: Path,
) -> None:
    catalog = StateCatalog(tmp_path / "home")
    short = _commit(catalog, chain(messages=TURN_1[:1], whole=True), 1)
    longer = _commit(catalog, chain(messages=TURN_1, whole=True), 2)
    _commit(catalog, chain(P_OTHER, messages=TURN_1, whole=True), 3, principal=P_OTHER)
    unrelated = _commit(catalog, chain(messages=[("user", "else")], whole=True), 4)
    found = catalog.find_prefix("local", chain(messages=TURN_2))
    assert [(shared, s.id) for shared, s in found] == [(2, longer.id), (1, short.id)]
    assert unrelated.id not in [s.id for _, s in found]
    assert catalog.find_prefix(P_OTHER, chain(P_OTHER, messages=TURN_2))[0][0] == 2
    assert catalog.find_prefix("local", []) == []
    raw = tmp_path / "home" / "runtime-state" / "v1" / "p_local" / longer.id / "metadata.json"
    assert decode_metadata(raw.read_bytes()).prefixes == tuple(
        fingerprints(chain(messages=TURN_1, whole=True))
    )


def test_a_state_without_prefixes_keeps_the_metadata_bytes_it_always_had(tmp_path: Path) -> None:
    catalog = StateCatalog(tmp_path / "home")
    state = _commit(catalog, [], 5)
    raw = tmp_path / "home" / "runtime-state" / "v1" / "p_local" / state.id / "metadata.json"
    assert b"prefixes" not in raw.read_bytes()
