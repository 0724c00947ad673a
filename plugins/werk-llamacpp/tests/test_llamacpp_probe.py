"""The functional state probe (werk_llamacpp.probe) against real llama-server processes.

A process passes only when the whole save/erase/restore/replay cycle is observed; each failing
case below is a real process (or a handle whose recorded facts disagree with its process) that
must keep the state capabilities unavailable, with the reason, and must leave no slot content or
file behind. Flags are preconditions only: a handle that *claims* ``--slot-save-path`` for a
process started without it still fails, on the observed refusal.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from test_llamacpp_states_support import (
    Child,
    demo_model,
    llama_child,
    make_handle,
    needs_llama_server,
    runtime_for,
    slot_files,
)
from werk_llamacpp import states
from werk_llamacpp.canary import canary_dir
from werk_llamacpp.handle import LlamaHandle, ProbeStatus
from werk_llamacpp.probe import (
    PROBE_CANDIDATES,
    effective_arg,
    ensure_probed,
    run_probe,
    start_early_probe,
)

from werk import CapabilityId, PrefillCall, Unavailable

STATE_SLOT = 1


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), None),
        (("--cache-ram", "0"), "0"),
        (("--cache-ram", "0", "-cram", "512"), "512"),
        (("--cache-ram=0",), "0"),
        (("--cache-ram", "0", "--cache_ram", "8192"), "8192"),
        (("--cache_ram=64", "--cache-ram", "0"), "0"),
        (("-m", "x.gguf", "--cache-ram"), None),
        (("--cache-ramp", "0"), None),
    ],
)
def test_effective_arg_is_the_last_spelling_llama_cpp_would_parse(
    args: tuple[str, ...], expected: str | None
) -> None:
    assert effective_arg(args, ("--cache-ram", "-cram")) == expected


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llama-probe")


@pytest.fixture(scope="module")
def child(work: Path) -> Iterator[Child]:
    with llama_child(work, demo_model(work)) as running:
        yield running


@pytest.fixture
async def handle(child: Child) -> AsyncIterator[LlamaHandle]:
    made = make_handle(child, state_slots=(STATE_SLOT,))
    try:
        yield made
    finally:
        await made.http.aclose()


def _state_slot_tokens(child: Child) -> int:
    with child.direct() as direct:
        n: int = direct.post(f"/slots/{STATE_SLOT}?action=erase").json()["n_erased"]
    return n


pytestmark = [pytest.mark.anyio]


@pytest.mark.slow
@needs_llama_server
async def test_a_working_process_passes_once_and_leaves_nothing_behind(
    handle: LlamaHandle, child: Child
) -> None:
    before = len(child.prompt_evals(STATE_SLOT))
    async with anyio.create_task_group() as group:  # concurrent first uses share one probe
        for _ in range(3):
            group.start_soon(ensure_probed, handle)
    assert handle.probe.status is ProbeStatus.PASSED, handle.probe.reason
    assert "replay reused" in handle.probe.reason
    assert handle.prefix.status is ProbeStatus.PASSED, handle.prefix.reason
    # One probe = nine completions in the state slot. Steps 1-6: the prompt but its last token
    # (all computed), the whole prompt (one computed), the replay after restore (one computed).
    # The prefix step: a cold run in the chunks a continuation has (the prompt but its last
    # token, that token, the suffix but its last token, the last token), then the restored
    # state continued: only the suffix computed, in the same chunks as cold.
    evals = child.prompt_evals(STATE_SLOT)
    assert len(evals) == before + 9
    prompt, one, replay, cold_head, cold_last, suffix, last, head, tail = evals[-9:]
    assert prompt > 1 and one == replay == 1
    assert cold_head == prompt and cold_last == 1 and suffix > 1 and last == 1
    assert head == suffix and tail == 1  # the restored prefix was reused, not recomputed
    assert (await ensure_probed(handle)).status is ProbeStatus.PASSED
    assert len(child.prompt_evals(STATE_SLOT)) == before + 9
    assert _state_slot_tokens(child) == 0
    assert slot_files(child) == []


async def _expect_failure(handle: LlamaHandle, child: Child | None, reason: str) -> None:
    """The probe fails with ``reason``; prefill is refused as unavailable; nothing is left."""
    result = await run_probe(handle)
    assert result.status is ProbeStatus.FAILED
    assert reason in result.reason, result.reason
    handle.probe = result
    with pytest.raises(Unavailable) as refused:
        await states.prefill(runtime_for(handle), PrefillCall(prompt="hello"))
    assert refused.value.capability == CapabilityId.PD_PREFILL
    assert reason in refused.value.message
    assert handle.probe is result  # a failed generation is not probed again
    if child is not None:
        assert _state_slot_tokens(child) == 0
        assert slot_files(child) == []


@pytest.mark.slow
@needs_llama_server
async def test_without_cache_ram_zero_reuse_cannot_be_proven(work: Path) -> None:
    with llama_child(work, demo_model(work), cache_ram_zero=False) as child:
        handle = make_handle(child, state_slots=(STATE_SLOT,))
        try:
            await _expect_failure(handle, child, "--cache-ram 0")
        finally:
            await handle.http.aclose()


@pytest.mark.slow
@needs_llama_server
async def test_a_trailing_native_override_of_cache_ram_fails(work: Path) -> None:
    with llama_child(work, demo_model(work), extra=["--cache_ram", "64"]) as child:
        handle = make_handle(child, state_slots=(STATE_SLOT,))
        try:
            await _expect_failure(handle, child, "--cache-ram 0")
        finally:
            await handle.http.aclose()


@pytest.mark.slow
@needs_llama_server
async def test_a_process_that_ignores_the_slot_flag_fails_on_the_observed_refusal(
    work: Path,
) -> None:
    """Stands for a llama-server that advertises slot persistence but does not do it: the real
    binary started without ``--slot-save-path`` while the handle records that it has one."""
    with llama_child(work, demo_model(work), slot_save_path=False) as child:
        claimed = (*child.args, "--slot-save-path", str(child.slot_dir))
        handle = make_handle(child, state_slots=(STATE_SLOT,), args=claimed)
        try:
            # Every /slots action is refused (501), erase first; the slot cannot hold probe data.
            await _expect_failure(handle, None, "refused slot erase (HTTP 501")
            assert slot_files(child) == []
        finally:
            await handle.http.aclose()


@pytest.mark.slow
@needs_llama_server
async def test_without_the_slot_listing_idleness_cannot_be_shown(work: Path) -> None:
    with llama_child(work, demo_model(work), extra=["--no-slots"]) as child:
        handle = make_handle(child, state_slots=(STATE_SLOT,))
        try:
            await _expect_failure(handle, child, "refused slot listing")
        finally:
            await handle.http.aclose()


@pytest.mark.slow
@needs_llama_server
async def test_a_slot_directory_that_is_not_private_fails(
    handle: LlamaHandle, child: Child
) -> None:
    child.slot_dir.chmod(0o755)
    try:
        await _expect_failure(handle, child, "not private")
    finally:
        child.slot_dir.chmod(0o700)


@pytest.mark.slow
@needs_llama_server
@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("total_slots", "/props reports 2 slots"),
        ("help", "does not advertise --slot-save-path"),
        ("slot_path", "not the process's private slot directory"),
        ("no_state_slot", "no state slot"),
        ("state_slot_range", "outside the server's slots"),
    ],
)
async def test_recorded_facts_that_disagree_with_the_process_fail(
    child: Child, work: Path, change: str, reason: str
) -> None:
    args, slots, total = child.args, (STATE_SLOT,), None
    if change == "total_slots":
        total = 3
    if change == "slot_path":
        args = (*args, "--slot-save-path", str(work))
    if change == "no_state_slot":
        slots = ()
    if change == "state_slot_range":
        slots, total = (2,), 2
    handle = make_handle(child, state_slots=slots, args=args, total_slots=total)
    if change == "help":
        handle.help_text = handle.help_text.replace("--slot-save-path", "--slot-something")
    try:
        await _expect_failure(handle, child, reason)
    finally:
        await handle.http.aclose()


@pytest.mark.slow
@needs_llama_server
async def test_the_early_probe_proves_a_canary_and_a_tampered_distribution_fails(
    child: Child, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Generations of one lineage in turn (each a new handle on the same process, as the
    process layer makes one per child): the first leaves a canary, the early probe of the next
    proves it without any Prefill, and a canary whose recorded candidate log-probabilities are
    off by 1e-3 (its slot file and digest intact) fails the cross-restart step."""
    monkeypatch.setenv("WERK_HOME", str(tmp_path))
    lineage = f"lineage-{secrets.token_hex(4)}"

    def generation() -> LlamaHandle:
        made = make_handle(child, state_slots=(STATE_SLOT,))
        made.lineage = lineage
        return made

    first, second, third, fourth = (generation() for _ in range(4))
    try:
        assert await _early(first) is ProbeStatus.NOT_RUN  # no canary: nothing run early
        assert (await ensure_probed(first)).status is ProbeStatus.PASSED
        assert first.cross_restart.status is ProbeStatus.FAILED
        assert "no earlier process generation" in first.cross_restart.reason
        record_path = canary_dir(lineage) / "canary.json"
        record = json.loads(record_path.read_text())
        assert record["generation"] == first.generation
        assert len(record["top_logprobs"]) == PROBE_CANDIDATES

        assert await _early(second) is ProbeStatus.PASSED  # proven before any Prefill
        assert second.cross_restart.status is ProbeStatus.PASSED, second.cross_restart.reason
        assert f"saved by generation {first.generation}" in second.cross_restart.reason

        record["top_logprobs"][0][1] += 1e-3
        record_path.write_text(json.dumps(record))
        assert await _early(third) is ProbeStatus.PASSED  # this generation's own cycle passed
        assert third.cross_restart.status is ProbeStatus.FAILED
        assert "other candidate tokens or log-probabilities" in third.cross_restart.reason
        assert json.loads(record_path.read_text())["generation"] == third.generation  # replaced

        assert await _early(fourth) is ProbeStatus.PASSED
        assert fourth.cross_restart.status is ProbeStatus.PASSED, fourth.cross_restart.reason
        assert _state_slot_tokens(child) == 0
        assert slot_files(child) == []
    finally:
        for made in (first, second, third, fourth):
            await made.http.aclose()


async def _early(handle: LlamaHandle) -> ProbeStatus:
    task = start_early_probe(handle)
    assert task is not None
    return (await task).status
