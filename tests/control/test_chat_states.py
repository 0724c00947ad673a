"""How a persisted ``/v1`` chat turn decides what to keep and what to delete
(:class:`werk.control.chat_states.PersistedChats`), with the prefill flow and the store faked:
where the backend has proven prefix continuation the turn's prompt is not written to disk (the
state with the reply is the turn's one state), and a state is superseded only once a newer one
of the conversation is kept. The same turns against a real llama-server are in
``plugins/werk-llamacpp/tests/test_llamacpp_prefix_e2e.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from werk.control.chat_states import PersistedChats
from werk.protocol import (
    CapabilityId,
    CapabilityReport,
    CapabilityStatus,
    ChatStateOptions,
    DecodeResponse,
    DecodeUsage,
    FinishReason,
    InvalidRequest,
    NotFound,
    PrefillUsage,
    Retention,
    ReuseInfo,
    ReuseMatch,
    ReuseOutcome,
    Unavailable,
)

PRINCIPAL = "p_test"
MESSAGES = [{"role": "user", "content": "turn one"}]
OPTIONS = ChatStateOptions(persist=True, allow_experimental=True)


SHARED_START, THIS_CONVERSATION = "pp_system", "pp_turn_one"
"""Prefix fingerprints: of the system prompt alone, and of this conversation so far (the
fakes' stand-ins for :func:`werk.state.prefixes.prefix_chain`)."""


class FakeCatalog:
    """States by id, each with its origin; prune deletes them. A state's conversation is this
    turn's, whole, unless it is listed in ``others`` (it shares only the system prompt)."""

    def __init__(self, states: dict[str, str], others: frozenset[str] = frozenset()) -> None:
        self.states = dict(states)
        self.others = others

    def get(self, principal: str, state_id: str) -> Any:
        if state_id not in self.states:
            raise NotFound("no such state")
        whole = "pp_another_conversation" if state_id in self.others else THIS_CONVERSATION
        return SimpleNamespace(origin=self.states[state_id], prefixes=(SHARED_START, whole))

    def prune(self, principal: str, request: Any, *, busy: Any) -> Any:
        deleted = [i for i in request.ids if i in self.states]
        for state_id in deleted:
            del self.states[state_id]
        return SimpleNamespace(deleted=deleted)


class FakeFlow:
    """Records the turn's prefill and keep; answers as told."""

    def __init__(self, *, kept_state: str | None, reuse: ReuseInfo, reply: str, keeps: bool):
        self._kept_state, self._reuse, self._reply, self._keeps = kept_state, reuse, reply, keeps
        self.prefilled: Any = None
        self.kept: Any = None

    async def prefill(self, principal: str, request: Any, *, origin: str | None = None) -> Any:
        self.prefilled = request
        state = None
        if self._reuse.match is ReuseMatch.EXACT:  # an exact reuse names the state reused
            state = SimpleNamespace(id=self._reuse.state_id)
        elif request.policy.retention is Retention.DISK:
            state = SimpleNamespace(id=self._kept_state)
        return SimpleNamespace(
            state=state,
            handoff=SimpleNamespace(token="wh_" + "1" * 16),
            reuse=self._reuse,
            usage=PrefillUsage(prompt_tokens=40, cached_tokens=30, evaluated_tokens=10),
        )

    def prompt_prefixes(self, principal: str, request: Any) -> frozenset[str]:
        return frozenset({SHARED_START, THIS_CONVERSATION})

    async def decode_turn(
        self, principal: str, request: Any, *, continues: bool, on_text: Any = None
    ) -> Any:
        assert continues
        if on_text is not None:
            await on_text(self._reply)
        response = DecodeResponse(
            text=self._reply,
            finish_reason=FinishReason.STOP,
            usage=DecodeUsage(completion_tokens=3),
        )
        return SimpleNamespace(response=response)

    async def keep_continuation(
        self, principal: str, request: Any, turn: Any, *, origin: str | None = None
    ) -> Any:
        self.kept = request
        if not self._keeps:
            raise Unavailable("the backend no longer holds the turn's state")
        return SimpleNamespace(id="s_reply"), SimpleNamespace(prompt_tokens=43)


def _service(proven: bool, catalog: FakeCatalog) -> Any:
    status = CapabilityStatus.EXPERIMENTAL if proven else CapabilityStatus.UNAVAILABLE
    rows = [
        CapabilityReport(
            id=CapabilityId.STATE_RESTORE_PREFIX,
            status=status,
            reason="the probe continued a prefix" if proven else "not proven yet",
        )
    ]
    runtime = SimpleNamespace(alive=True, model=SimpleNamespace(id="demo"), generation="g_1")

    async def rows_for(spec: Any, rt: Any) -> list[CapabilityReport]:
        return rows

    return SimpleNamespace(
        config=SimpleNamespace(persistence_defaults=None),
        runtimes=SimpleNamespace(live=lambda: {"demo": runtime}),
        rows_for=rows_for,
        catalog=catalog,
        handoffs=SimpleNamespace(live_state_ids=lambda principal: set()),
    )


def _turn(flow: FakeFlow, *, proven: bool, catalog: FakeCatalog, **extra: Any) -> dict[str, Any]:
    chats = PersistedChats(_service(proven, catalog), flow)  # type: ignore[arg-type]
    body = {"model": "demo", "messages": MESSAGES, "werk": {"persist": True}, **extra}

    async def run() -> dict[str, Any]:
        return await chats.complete(PRINCIPAL, body, OPTIONS)

    werk: dict[str, Any] = anyio.run(run)["werk"]
    return werk


PREFIX = ReuseInfo(
    outcome=ReuseOutcome.REUSED, state_id="s_prev", match=ReuseMatch.PREFIX, restored_tokens=30
)


def test_once_prefix_continuation_is_proven_a_turn_writes_only_the_state_with_its_reply() -> None:
    catalog = FakeCatalog({"s_prev": "chat"})
    flow = FakeFlow(kept_state="s_prompt", reuse=PREFIX, reply="an answer", keeps=True)
    werk = _turn(flow, proven=True, catalog=catalog)
    assert flow.prefilled.policy.retention is Retention.EPHEMERAL
    assert [m.role for m in flow.kept.messages] == ["user", "assistant"]
    assert flow.kept.policy.retention is Retention.DISK
    assert (werk["state_id"], werk["state_tokens"]) == ("s_reply", 43)
    assert werk["superseded"] == ["s_prev"]
    assert catalog.states == {}


def test_before_the_proof_the_prompt_is_kept_too_and_replaced_by_the_state_with_the_reply() -> None:
    catalog = FakeCatalog({"s_prev": "chat", "s_prompt": "chat"})
    flow = FakeFlow(kept_state="s_prompt", reuse=PREFIX, reply="an answer", keeps=True)
    werk = _turn(flow, proven=False, catalog=catalog)
    assert flow.prefilled.policy.retention is Retention.DISK
    assert werk["state_id"] == "s_reply"
    assert werk["superseded"] == ["s_prev"]  # the prompt state made by this turn is not listed
    assert catalog.states == {}


def test_a_reply_that_cannot_be_kept_leaves_the_continued_state_the_conversations() -> None:
    catalog = FakeCatalog({"s_prev": "chat"})
    flow = FakeFlow(kept_state="s_prompt", reuse=PREFIX, reply="an answer", keeps=False)
    werk = _turn(flow, proven=True, catalog=catalog)
    assert (werk["state_id"], werk["state_tokens"]) == ("s_prev", 30)
    assert werk["superseded"] == []
    assert catalog.states == {"s_prev": "chat"}  # nothing lost


def test_without_the_proof_a_reply_that_cannot_be_kept_leaves_the_prompt_state() -> None:
    catalog = FakeCatalog({"s_prev": "chat", "s_prompt": "chat"})
    flow = FakeFlow(kept_state="s_prompt", reuse=PREFIX, reply="an answer", keeps=False)
    werk = _turn(flow, proven=False, catalog=catalog)
    assert (werk["state_id"], werk["state_tokens"]) == ("s_prompt", 40)
    assert werk["superseded"] == ["s_prev"]
    assert catalog.states == {"s_prompt": "chat"}


@pytest.mark.parametrize("proven", [True, False])
def test_an_empty_reply_keeps_the_messages_where_the_prompt_was_not_kept(proven: bool) -> None:
    catalog = FakeCatalog({"s_prev": "chat", "s_prompt": "chat"})
    flow = FakeFlow(kept_state="s_prompt", reuse=PREFIX, reply="", keeps=True)
    werk = _turn(flow, proven=proven, catalog=catalog)
    if proven:
        assert [m.role for m in flow.kept.messages] == ["user"]
        assert werk["state_id"] == "s_reply"
    else:  # the prompt state is already the conversation's
        assert flow.kept is None
        assert werk["state_id"] == "s_prompt"
    assert werk["superseded"] == ["s_prev"]


def test_an_exact_reuse_is_listed_when_the_state_with_the_reply_replaces_it() -> None:
    exact = ReuseInfo(
        outcome=ReuseOutcome.REUSED, state_id="s_same", match=ReuseMatch.EXACT, restored_tokens=40
    )
    catalog = FakeCatalog({"s_same": "chat"})
    flow = FakeFlow(kept_state=None, reuse=exact, reply="again", keeps=True)
    werk = _turn(flow, proven=True, catalog=catalog)
    assert werk["state_id"] == "s_reply"
    assert werk["superseded"] == ["s_same"]


def test_a_state_saved_otherwise_is_never_deleted_by_the_turn_that_continued_it() -> None:
    catalog = FakeCatalog({"s_prev": "api"})  # e.g. a shared system prompt saved by a prefill
    flow = FakeFlow(kept_state=None, reuse=PREFIX, reply="an answer", keeps=True)
    werk = _turn(flow, proven=True, catalog=catalog)
    assert werk["superseded"] == []
    assert catalog.states == {"s_prev": "api"}


def test_a_state_of_another_conversation_sharing_its_start_is_continued_but_not_deleted() -> None:
    catalog = FakeCatalog({"s_prev": "chat"}, others=frozenset({"s_prev"}))
    flow = FakeFlow(kept_state=None, reuse=PREFIX, reply="an answer", keeps=True)
    werk = _turn(flow, proven=True, catalog=catalog)
    assert werk["state_id"] == "s_reply"
    assert werk["superseded"] == []
    assert catalog.states == {"s_prev": "chat"}  # still the other conversation's


def test_fields_client_libraries_send_are_accepted_where_they_ask_for_nothing_more() -> None:
    flow = FakeFlow(kept_state=None, reuse=PREFIX, reply="an answer", keeps=True)
    extra = {"n": 1, "stream_options": {"include_usage": True}, "user": "alice"}
    werk = _turn(flow, proven=True, catalog=FakeCatalog({"s_prev": "chat"}), **extra)
    assert werk["state_id"] == "s_reply"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("n", True),
        ("stream_options", {"include_usage": True, "continuous_usage_stats": True}),
        ("stream_options", {"include_usage": "yes"}),
        ("stream_options", ["include_usage"]),
        ("user", 7),
        ("top_p", 0.9),
    ],
)
def test_a_field_or_value_a_turn_cannot_honour_is_refused_naming_it(field: str, value: Any) -> None:
    flow = FakeFlow(kept_state=None, reuse=PREFIX, reply="an answer", keeps=True)
    with pytest.raises(InvalidRequest) as refused:
        _turn(flow, proven=True, catalog=FakeCatalog({"s_prev": "chat"}), **{field: value})
    assert refused.value.param == field
    assert flow.prefilled is None  # before any backend work
