"""Named states on a real llama-server: prefill, decode, snapshot, restore (werk_llamacpp.states).

Every test drives the plugin's state functions directly with a real ``LlamaHandle`` around a real
llama-server (tiny generated demo model, ``-np 2``: slot 0 plays ``/v1``, slot 1 is the state
slot, ``--cache-ram 0``). Reuse is always judged by the server's own counters: ``cached_tokens``
(``timings.cache_n``) for prefill, and for decode the prompt tokens the server logged as computed
for that task. Controls run the same greedy request uncached in another slot.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from test_llamacpp_states_support import (
    Child,
    llama_child,
    make_handle,
    needs_llama_server,
    payload_copy,
    runtime_for,
    slot_files,
    spill_files,
    uncached_completion,
)
from werk_llamacpp import spills, states
from werk_llamacpp.handle import LlamaHandle, ProbeStatus
from werk_llamacpp.slots import SlotState, tokenize

from werk import (
    BackendError,
    BackendState,
    ChatMessage,
    DecodeCall,
    FinishReason,
    IncompatibleState,
    InvalidRequest,
    Policy,
    PrefillCall,
    Reuse,
    ReuseUnavailable,
    StateKind,
)

pytestmark = [pytest.mark.slow, needs_llama_server, pytest.mark.anyio]

PROMPT = "Once upon a time, in a workshop full of clocks, a careful engineer wrote a test. " * 2
OTHER = "A completely different prompt about rivers, mountains and the colour of the sky."
STATE_SLOT, PROXY_SLOT = 1, 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    from test_llamacpp_states_support import demo_model

    work = tmp_path_factory.mktemp("llama-states")
    with llama_child(work, demo_model(work)) as running:
        yield running


@pytest.fixture
async def handle(child: Child) -> AsyncIterator[LlamaHandle]:
    made = make_handle(child, state_slots=(STATE_SLOT,))
    try:
        yield made
    finally:
        await spills.drop_all(made)  # what ending the process generation does
        await made.http.aclose()


def _slot_state(state: BackendState) -> SlotState:
    assert state.kind is StateKind.HANDLE
    assert isinstance(state.handle, SlotState)
    return state.handle


async def test_prefill_runs_the_probe_then_evaluates_in_an_erased_state_slot(
    handle: LlamaHandle, child: Child
) -> None:
    assert handle.probe.status is ProbeStatus.NOT_RUN
    outcome = await states.prefill(runtime_for(handle), PrefillCall(prompt=PROMPT))
    assert handle.probe.status is ProbeStatus.PASSED, handle.probe.reason
    assert handle.generation in handle.probe.reason
    tokens = await tokenize(handle, PROMPT)
    live = _slot_state(outcome.state)
    assert (live.slot, live.generation, live.tokens) == (STATE_SLOT, handle.generation, tokens)
    assert outcome.prompt_tokens == len(tokens) == outcome.state.tokens
    # A new state gets an erased slot: nothing is reused (the RAM cache is off).
    assert outcome.cached_tokens == 0
    assert outcome.state.generation == handle.generation
    assert "tokens" not in repr(live)
    assert slot_files(child) == []  # the probe cleaned up after itself


async def test_decode_reuses_the_prefilled_slot_and_matches_an_uncached_run(
    handle: LlamaHandle, child: Child
) -> None:
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    n = outcome.prompt_tokens
    evals_before = child.prompt_evals(STATE_SLOT)
    decoded = await states.decode(runtime, DecodeCall(state=outcome.state, max_tokens=12))
    evals = child.prompt_evals(STATE_SLOT)
    # The server computed exactly one prompt token for the decode: cache_n = n - 1.
    assert len(evals) == len(evals_before) + 1 and evals[-1] == 1
    control = uncached_completion(child, PROXY_SLOT, list(_slot_state(outcome.state).tokens), 12)
    assert control["timings"]["cache_n"] == 0 and control["timings"]["prompt_n"] == n
    assert decoded.text == control["content"]
    assert decoded.completion_tokens == 12
    assert decoded.finish_reason is FinishReason.LENGTH
    assert decoded.state is None


async def test_a_decode_that_would_re_prefill_fails(handle: LlamaHandle, child: Child) -> None:
    """The slot is emptied behind Werk's back: the server would recompute the whole prompt, and
    decode must refuse instead of returning that text."""
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    with child.direct() as direct:
        assert direct.post(f"/slots/{STATE_SLOT}?action=erase").json()["n_erased"] > 0
    with pytest.raises(BackendError, match="refusing to re-prefill silently"):
        await states.decode(runtime, DecodeCall(state=outcome.state, max_tokens=4))
    # The server's log shows why: the whole prompt was computed again.
    assert child.prompt_evals(STATE_SLOT)[-1] == outcome.prompt_tokens
    # The state is now stale: it is refused before any request is sent.
    evals = len(child.prompt_evals(STATE_SLOT))
    with pytest.raises(ReuseUnavailable, match="given to another state or emptied"):
        await states.decode(runtime, DecodeCall(state=outcome.state, max_tokens=4))
    assert len(child.prompt_evals(STATE_SLOT)) == evals


async def test_a_held_state_is_spilled_for_a_newer_one_and_decoded_from_its_spill(
    handle: LlamaHandle, child: Child
) -> None:
    """One state slot, two prefills before either decode (two clients): the first state is
    saved to a spill before the second takes the slot, and each decode restores its own."""
    runtime = runtime_for(handle)
    first = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    second = await states.prefill(runtime, PrefillCall(prompt=OTHER))
    assert _slot_state(second.state).epoch > _slot_state(first.state).epoch
    assert len(spill_files(child)) == 1
    decoded = await states.decode(runtime, DecodeCall(state=first.state, max_tokens=12))
    control = uncached_completion(child, PROXY_SLOT, list(_slot_state(first.state).tokens), 12)
    assert decoded.text == control["content"] and decoded.completion_tokens == 12
    assert len(spill_files(child)) == 1  # first's spill ended; second was spilled for it
    other = await states.decode(runtime, DecodeCall(state=second.state, max_tokens=12))
    control = uncached_completion(child, PROXY_SLOT, list(_slot_state(second.state).tokens), 12)
    assert other.text == control["content"]
    assert spill_files(child) == []  # both decoded: nothing kept


async def test_a_reply_is_kept_from_the_slot_it_was_decoded_in_and_held_only_until_saved(
    handle: LlamaHandle, child: Child
) -> None:
    """What a persisted chat does after its reply: the prompt with the reply, continued from
    the decoded state (``decode`` false) — the slot already holds the reply, so the server
    reuses all but the last token — saved, and then its slot is free for the next state
    without a spill."""
    runtime = runtime_for(handle)
    turn = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    reply = await states.decode(runtime, DecodeCall(state=turn.state, max_tokens=12))
    required = Policy(reuse=Reuse.REQUIRED)
    evals = len(child.prompt_evals(STATE_SLOT))
    kept = await states.prefill(
        runtime,
        PrefillCall(
            prompt=PROMPT + reply.text,
            policy=required,
            keep=True,
            reuse_from=turn.state,
            continued=True,
            decode=False,
        ),
    )
    assert kept.prompt_tokens > turn.prompt_tokens
    assert kept.cached_tokens is not None
    assert kept.prompt_tokens - 1 <= kept.cached_tokens < kept.prompt_tokens
    assert len(child.prompt_evals(STATE_SLOT)) == evals + 1
    saved = await states.snapshot(runtime, kept.state)
    assert saved.tokens == kept.prompt_tokens
    assert saved.path is not None
    saved.path.unlink()
    await states.prefill(runtime, PrefillCall(prompt=OTHER))  # takes the one state slot
    assert spill_files(child) == []  # the kept state was not held for a decode


async def test_a_decode_that_continues_keeps_its_slot_for_the_reply_even_when_another_needs_it(
    handle: LlamaHandle, child: Child
) -> None:
    """``continues``: the decoded state is held for the prefill that keeps the reply; a state
    that takes the one state slot in between spills it, and that prefill brings it back and
    still reuses the prompt and the reply instead of failing."""
    runtime = runtime_for(handle)
    turn = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    reply = await states.decode(
        runtime, DecodeCall(state=turn.state, max_tokens=12, continues=True)
    )
    assert reply.after is not None
    other = await states.prefill(runtime, PrefillCall(prompt=OTHER))  # wants the slot
    assert len(spill_files(child)) == 1  # the decoded state was spilled, not dropped
    kept = await states.prefill(
        runtime,
        PrefillCall(
            prompt=PROMPT + reply.text,
            policy=Policy(reuse=Reuse.REQUIRED),
            keep=True,
            reuse_from=reply.after,
            continued=True,
            decode=False,
        ),
    )
    assert kept.cached_tokens is not None
    assert kept.prompt_tokens - 1 <= kept.cached_tokens < kept.prompt_tokens
    saved = await states.snapshot(runtime, kept.state)
    assert saved.path is not None
    saved.path.unlink()
    await states.decode(runtime, DecodeCall(state=other.state, max_tokens=2))
    assert spill_files(child) == []  # nothing is held any more


async def test_a_decoded_state_is_not_kept_and_a_newer_one_stales_it(
    handle: LlamaHandle, child: Child
) -> None:
    runtime = runtime_for(handle)
    first = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    await states.decode(runtime, DecodeCall(state=first.state, max_tokens=2))  # hold ends
    second = await states.prefill(runtime, PrefillCall(prompt=OTHER))
    assert _slot_state(second.state).epoch > _slot_state(first.state).epoch
    assert spill_files(child) == []  # nothing awaited first's decode any more
    with pytest.raises(ReuseUnavailable, match="not resident"):
        await states.decode(runtime, DecodeCall(state=first.state, max_tokens=2))
    with pytest.raises(BackendError, match="no longer resident"):
        await states.snapshot(runtime, first.state)
    required = Policy(reuse=Reuse.REQUIRED)
    with pytest.raises(ReuseUnavailable):
        await states.prefill(
            runtime, PrefillCall(prompt=PROMPT, policy=required, reuse_from=first.state)
        )
    # prefer: evaluated afresh, and the count says so.
    prefer = Policy(reuse=Reuse.PREFER)
    fresh = await states.prefill(
        runtime, PrefillCall(prompt=PROMPT, policy=prefer, reuse_from=second.state)
    )
    assert fresh.cached_tokens == 0  # OTHER shares nothing with PROMPT
    again = await states.prefill(
        runtime, PrefillCall(prompt=PROMPT, policy=prefer, reuse_from=fresh.state)
    )
    assert again.cached_tokens == again.prompt_tokens - 1
    decoded = await states.decode(runtime, DecodeCall(state=again.state, max_tokens=3))
    assert decoded.completion_tokens == 3


async def test_snapshot_restore_continue_and_decode(
    handle: LlamaHandle, child: Child, tmp_path: Path
) -> None:
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    n = outcome.prompt_tokens
    snap = await states.snapshot(runtime, outcome.state)
    assert snap.kind is StateKind.FILE and snap.path is not None
    assert snap.path.parent == child.slot_dir
    assert snap.tokens == n and snap.logical_bytes is not None
    assert snap.path.stat().st_size > snap.logical_bytes  # the server's bytes plus the trailer
    assert stat.S_IMODE(snap.path.stat().st_mode) == 0o600
    payload = payload_copy(snap, tmp_path / "scratch.bin")
    # Another state takes the only state slot: the prefix is gone from the server.
    await states.prefill(runtime, PrefillCall(prompt=OTHER))
    restored = await states.restore(runtime, payload)
    assert not payload.path or not payload.path.exists()  # moved into the slot directory
    assert slot_files(child) == []  # and removed once restored
    assert restored.kind is StateKind.HANDLE and restored.tokens == n
    assert restored.logical_bytes == snap.logical_bytes
    evals = len(child.prompt_evals(STATE_SLOT))
    continued = await states.prefill(
        runtime, PrefillCall(prompt=PROMPT, reuse_from=restored, policy=Policy(reuse=Reuse.PREFER))
    )
    # Just restored with exactly the prompt's tokens: nothing evaluated, all n acknowledged by
    # the server's restore; the decode computes the last prompt token (cache_n = n - 1).
    assert continued.cached_tokens == n
    assert len(child.prompt_evals(STATE_SLOT)) == evals
    decoded = await states.decode(runtime, DecodeCall(state=continued.state, max_tokens=10))
    assert child.prompt_evals(STATE_SLOT)[evals:] == [1]
    control = uncached_completion(child, PROXY_SLOT, list(_slot_state(outcome.state).tokens), 10)
    assert decoded.text == control["content"]


async def test_only_a_just_restored_state_with_exactly_the_prompt_skips_the_evaluation(
    handle: LlamaHandle, child: Child, tmp_path: Path
) -> None:
    """A longer prompt evaluates its extension (the server's cache_n counts the restored
    prefix); a restored slot emptied behind Werk's back before the skipped evaluation is caught
    where the text is made: the decode refuses instead of re-prefilling."""
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    n = outcome.prompt_tokens
    snap = await states.snapshot(runtime, outcome.state)
    prefer = Policy(reuse=Reuse.PREFER)

    first = payload_copy(snap, tmp_path / "a.bin")
    assert first.path is not None
    second = BackendState(kind=first.kind, path=tmp_path / "b.bin", generation=first.generation)
    shutil.copyfile(first.path, tmp_path / "b.bin")  # a restore consumes its payload

    restored = await states.restore(runtime, first)
    longer = await states.prefill(
        runtime, PrefillCall(prompt=PROMPT + " And then?", reuse_from=restored, policy=prefer)
    )
    assert longer.cached_tokens == n and longer.prompt_tokens > n  # the server's own cache_n
    assert child.prompt_evals(STATE_SLOT)[-1] == longer.prompt_tokens - n

    restored = await states.restore(runtime, second)
    with child.direct() as direct:
        assert direct.post(f"/slots/{STATE_SLOT}?action=erase").json()["n_erased"] == n
    skipped = await states.prefill(
        runtime, PrefillCall(prompt=PROMPT, reuse_from=restored, policy=prefer)
    )
    assert skipped.cached_tokens == n  # the restore's acknowledgement; nothing evaluated yet
    with pytest.raises(BackendError, match="refusing to re-prefill silently"):
        await states.decode(runtime, DecodeCall(state=skipped.state, max_tokens=4))


async def test_restore_refuses_a_snapshot_of_another_generation(
    handle: LlamaHandle, child: Child, tmp_path: Path
) -> None:
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    payload = payload_copy(await states.snapshot(runtime, outcome.state), tmp_path / "s.bin")
    other = make_handle(child, state_slots=(STATE_SLOT,))
    try:
        await states.prefill(runtime_for(other), PrefillCall(prompt=OTHER))  # probe passes
        with pytest.raises(IncompatibleState):
            await states.restore(runtime_for(other), payload)
        with pytest.raises(IncompatibleState):
            await states.decode(runtime_for(other), DecodeCall(state=outcome.state))
    finally:
        await other.http.aclose()
    assert slot_files(child) == []


async def test_a_restore_whose_acknowledgement_disagrees_erases_the_slot(
    handle: LlamaHandle, child: Child, tmp_path: Path
) -> None:
    """The trailer claims one token more than the server restores: Werk must refuse and erase
    the (fully loaded) slot itself before anyone uses it."""
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    snap = await states.snapshot(runtime, outcome.state)
    assert snap.path is not None and snap.logical_bytes is not None
    raw = snap.path.read_bytes()
    body, trailer = raw[: snap.logical_bytes], raw[snap.logical_bytes : -16]
    tampered = trailer.replace(b'"n_saved":%d' % snap.tokens, b'"n_saved":%d' % (snap.tokens + 1))
    assert tampered != trailer
    scratch = tmp_path / "tampered.bin"
    scratch.write_bytes(body + tampered + len(tampered).to_bytes(8, "little") + b"WERKLCS1")
    snap.path.unlink()
    with pytest.raises(BackendError, match="restored"):
        await states.restore(runtime, BackendState(kind=StateKind.FILE, path=scratch,
                                                    generation=handle.generation))  # fmt: skip
    with child.direct() as direct:
        assert direct.post(f"/slots/{STATE_SLOT}?action=erase").json()["n_erased"] == 0
    assert slot_files(child) == []


@pytest.mark.parametrize(
    "payload",
    [b"", b"not a snapshot at all", b"x" * 100 + b"\x05" + b"\x00" * 7 + b"WERKLCS1"],
    ids=["empty", "foreign", "bad-trailer"],
)
async def test_a_malformed_payload_is_refused_without_leftovers(
    handle: LlamaHandle, child: Child, payload: bytes
) -> None:
    runtime = runtime_for(handle)
    await states.prefill(runtime, PrefillCall(prompt=OTHER))
    with pytest.raises(BackendError):
        await states.restore(
            runtime, BackendState(kind=StateKind.BYTES, data=payload, generation=handle.generation)
        )
    assert slot_files(child) == []


async def test_messages_use_the_servers_chat_template(handle: LlamaHandle, child: Child) -> None:
    runtime = runtime_for(handle)
    messages = [
        ChatMessage(role="system", content="You are terse."),
        ChatMessage(role="user", content="Name three clocks."),
    ]
    outcome = await states.prefill(runtime, PrefillCall(messages=messages))
    rendered = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nName three clocks.<|im_end|>\n<|im_start|>assistant\n"
    )
    assert _slot_state(outcome.state).tokens == await tokenize(handle, rendered)
    decoded = await states.decode(runtime, DecodeCall(state=outcome.state, max_tokens=8))
    with child.direct() as direct:
        direct.post(f"/slots/{PROXY_SLOT}?action=erase").raise_for_status()
        chat = direct.post(
            "/v1/chat/completions",
            json={
                "messages": [{"role": m.role, "content": m.content} for m in messages],
                "max_tokens": 8,
                "temperature": 0.0,
                "id_slot": PROXY_SLOT,
            },
        ).json()
    assert chat["usage"]["prompt_tokens"] == outcome.prompt_tokens
    assert decoded.text == chat["choices"][0]["message"]["content"]


async def test_a_prompt_longer_than_the_slot_is_an_invalid_request(handle: LlamaHandle) -> None:
    runtime = runtime_for(handle)
    with pytest.raises(InvalidRequest, match="context"):
        await states.prefill(runtime, PrefillCall(prompt="word " * 3000))
    # The slot allocator is still usable afterwards.
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    assert outcome.cached_tokens == 0


async def test_snapshot_file_survives_fsync_and_holds_the_server_bytes(
    handle: LlamaHandle, child: Child
) -> None:
    runtime = runtime_for(handle)
    outcome = await states.prefill(runtime, PrefillCall(prompt=PROMPT))
    snap = await states.snapshot(runtime, outcome.state)
    assert snap.path is not None and snap.logical_bytes is not None
    with child.direct() as direct:
        name = "werk-control-" + "0" * 32 + ".slot"
        ack = direct.post(f"/slots/{STATE_SLOT}?action=save", json={"filename": name}).json()
    control = child.slot_dir / name
    try:
        # The server saves the same bytes again; Werk's file is them plus its trailer.
        assert ack["n_written"] == snap.logical_bytes and ack["n_saved"] == snap.tokens
        assert snap.path.read_bytes()[: snap.logical_bytes] == control.read_bytes()
    finally:
        os.unlink(control)
        snap.path.unlink()


async def test_a_missing_payload_file_is_a_backend_error(
    handle: LlamaHandle, child: Child, tmp_path: Path
) -> None:
    runtime = runtime_for(handle)
    await states.prefill(runtime, PrefillCall(prompt=OTHER))
    gone = BackendState(kind=StateKind.FILE, path=tmp_path / "gone.bin", generation="g_x")
    with pytest.raises(BackendError, match="could not be read"):
        await states.restore(runtime, gone)
    assert slot_files(child) == []
