"""The functional state probe: prove against one exact llama-server process that states work.

The seed's rule ("llama.cpp's experimental boundary"): state support starts fail-closed; the first
model-scoped Prefill runs an end-to-end probe against *that* process — prefill a private slot,
save it, erase it, restore it, replay from it and verify the observed slot/token state — and only
a generation that passed reports the state and prefill/decode capabilities as ``experimental``.
Nothing is inferred from a version string or from flags alone: the flags are only preconditions.

Preconditions (any miss fails the probe with the reason):

* the executable's ``--help`` advertises ``--slot-save-path`` and ``--cache-ram``;
* the effective arguments (the last occurrence wins, as in llama.cpp's parser) select
  ``--slot-save-path`` = the handle's private directory, and ``--cache-ram 0``: llama-server
  otherwise keeps a host-RAM prompt cache whose hits are indistinguishable from slot reuse in
  ``timings.cache_n``, so reuse evidence would prove nothing;
* the slot directory is a real directory owned by this user with mode ``0700``;
* ``/props.total_slots`` equals the handle's ``total_slots`` and the state slots lie below it.

Steps, in one state slot (a random nonce makes the prompt unseen before):

1. erase the slot; ``GET /slots`` shows it idle;
2. evaluate all but the prompt's last token (the control: a freshly erased slot must report
   ``timings.cache_n == 0``), then run the whole prompt greedily for :data:`PROBE_GENERATED`
   token with its :data:`PROBE_CANDIDATES` most likely candidates (``n_probs``): text *A* and
   distribution *P*, with ``cache_n == prompt tokens - 1``. Evaluating the last prompt token on
   its own gives the first run the same computation shape as the replay (which recomputes only
   that token): llama.cpp's CPU kernels round differently for one token than for a batch, and on
   near-tied logits (random-weight models) a different shape can flip a greedy choice;
3. save the slot under a Werk-generated name; the file's size equals ``n_written`` and
   ``n_saved`` covers at least the prompt;
4. erase it (``n_erased == n_saved``), erase again (``n_erased == 0``: the slot is empty);
5. restore it: ``n_restored == n_saved`` and ``n_read == n_written``;
6. replay the same request: the same text *A*, the same candidates in the same order with
   log-probabilities within :data:`LOGPROB_TOLERANCE` of *P*, and
   ``timings.cache_n == prompt tokens - 1`` (the server recomputes only the last prompt token), so
   the prefix came from the restored slot. The candidates' log-probabilities depend on every
   restored position of the KV cache, so one token with its distribution is a finer check than a
   few greedy tokens, and costs one forward pass instead of one per token.

**Prefix step** (after 1-6 passed): the saved probe state is continued with a longer prompt
(the probe prompt's tokens, then :data:`PROBE_SUFFIX`'s): a cold run of the longer prompt in the
erased slot gives text and candidates; the slot is erased, the probe file restored, and the same
longer prompt evaluated there must reuse the restored prefix (``timings.cache_n`` at least the
prompt's tokens, below all but the last of the longer prompt's: the rest was evaluated) and
reproduce the cold run's text and candidates. Only then does this generation report
``runtime.state.restore.prefix`` ``experimental``.

**Cross-restart step** (after 1-6 passed; :mod:`werk_llamacpp.canary`): when an *earlier*
generation of the same lineage (executable, model, arguments, slot layout, adapter) left a
canary, its slot file (SHA-256 checked) is restored into the slot, the canary's prompt replayed
greedily: the text and the candidates must equal the canary's (as in step 6) and
``timings.cache_n`` cover all but the last prompt token. Only then does this generation report
``runtime.state.restore.cross_restart`` ``experimental``. Without a canary (the first
generation of a lineage), or when the canary is corrupt or does not reproduce, this
generation's own probe save becomes the lineage's canary and the step reports why it did not
pass.

**When it runs.** On the generation's first Prefill or restore (which waits for it), or earlier:
when an earlier generation of the same lineage left a canary — a restart of a server whose
states were used — :func:`start_early_probe` runs it in the background as soon as the child is
ready, so a restored state's first request does not wait for the proof. ``/v1`` requests never
wait for it (they use the general slots; they share the CPU with it meanwhile); ``werk chat``'s
native cache, which reserves the state slot without running the probe, waits for it (the probe
takes the slot and retires it); a stop cancels it.

The slot is erased and the files deleted afterwards, pass or fail.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import stat
from collections.abc import Sequence

import anyio

from werk import WerkError

from .canary import Canary, load_canary, store_canary, verified_slot_file
from .handle import LlamaHandle, ProbeResult, ProbeStatus
from .inspect import sha256_file
from .slots import (
    Completion,
    LlamaRefused,
    allocator_for,
    complete_in_slot,
    erase_slot,
    llama_json,
    new_slot_filename,
    restore_slot,
    save_slot,
    slot_is_idle,
    tokenize,
)

__all__ = [
    "LOGPROB_TOLERANCE",
    "PROBE_CANDIDATES",
    "PROBE_GENERATED",
    "effective_arg",
    "ensure_probed",
    "run_probe",
    "start_early_probe",
]

log = logging.getLogger("werk.llamacpp")

PROBE_GENERATED = 1
"""Greedy tokens generated by the probe's first run and its replay (and the canary's)."""

PROBE_CANDIDATES = 8
"""Candidates (``n_probs``) of the generated token compared between a run and its replay."""

LOGPROB_TOLERANCE = 1e-4
"""How far a replayed candidate's log-probability may be from the first run's. Two identical
requests to this llama-server build gave identical values (checked by hand with ``n_probs`` on
the tiny demo model); the margin is for a kernel that splits a reduction differently, and lies
far below what a changed input moved there (one other prompt token: 0.008 to 0.04)."""

PROBE_TEXT = "Werk "
"""With a random 6-hex-digit nonce appended: a prompt no slot of this process has seen (the
slot is erased first and the RAM cache is off; the nonce only keeps probe prompts apart).
Short: its evaluation is most of the probe's cost (11 tokens for the demo models' byte-level
vocabulary: the first, batched evaluation costs ~25 ms plus ~3 ms per token on the 1 B medium
demo model on 2 cores, each single-token run ~20-30 ms)."""

PROBE_SUFFIX = " and more"
"""The text the prefix step appends to the probe prompt (its tokens, after the prompt's)."""

CACHE_RAM_FLAGS = ("--cache-ram", "-cram")
SLOT_PATH_FLAGS = ("--slot-save-path",)


class _ProbeFailed(Exception):
    """One precondition or observation did not hold; the message is the reason."""


def _spelling(arg: str) -> str:
    """llama.cpp's parser reads ``--cache_ram`` as ``--cache-ram``: compare normalised names."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value


def effective_arg(args: Sequence[str], names: Sequence[str]) -> str | None:
    """The value the last ``NAME VALUE`` or ``NAME=VALUE`` among ``names`` gives, or ``None``.

    Later occurrences win, as in llama.cpp's left-to-right parser; ``--x_y`` counts as ``--x-y``.
    """
    value: str | None = None
    index = 0
    while index < len(args):
        arg = _spelling(args[index])
        if arg in names:
            value = args[index + 1] if index + 1 < len(args) else None
            index += 2
            continue
        for name in names:
            if arg.startswith(name + "="):
                value = arg[len(name) + 1 :]
        index += 1
    return value


def _require(condition: bool, reason: str) -> None:
    if not condition:
        raise _ProbeFailed(reason)


def _check_preconditions(handle: LlamaHandle) -> None:
    for flag in ("--slot-save-path", "--cache-ram"):
        _require(flag in handle.help_text, f"the executable's --help does not advertise {flag}")
    cache_ram = effective_arg(handle.args, CACHE_RAM_FLAGS)
    _require(
        cache_ram is not None and cache_ram.strip() == "0",
        "the process does not run with --cache-ram 0, so its host-RAM prompt cache could "
        "answer for a slot and reuse could not be proven",
    )
    slot_path = effective_arg(handle.args, SLOT_PATH_FLAGS)
    _require(slot_path is not None, "the process runs without --slot-save-path")
    assert slot_path is not None
    _require(
        os.path.realpath(slot_path) == os.path.realpath(handle.slot_dir),
        "the effective --slot-save-path is not the process's private slot directory",
    )
    info = os.lstat(handle.slot_dir)
    _require(stat.S_ISDIR(info.st_mode), "the slot directory is not a plain directory")
    _require(info.st_uid == os.geteuid(), "the slot directory is not owned by this user")
    _require(stat.S_IMODE(info.st_mode) == 0o700, "the slot directory is not private (0700)")
    _require(bool(handle.state_slots), "the process has no state slot")
    _require(
        all(0 <= s < handle.total_slots for s in handle.state_slots),
        "a state slot id is outside the server's slots",
    )


async def _check_total_slots(handle: LlamaHandle) -> None:
    props = await llama_json(handle, "GET", "/props", "properties", timeout=30.0)
    total = props.get("total_slots") if isinstance(props, dict) else None
    _require(
        total == handle.total_slots,
        f"/props reports {total!r} slots, the process layer recorded {handle.total_slots}",
    )


async def _probe_run(
    handle: LlamaHandle, slot: int, tokens: Sequence[int], n_predict: int = PROBE_GENERATED
) -> Completion:
    """A greedy run of ``tokens`` in ``slot`` with the generated token's candidates."""
    return await complete_in_slot(
        handle, slot, tokens, n_predict=n_predict, n_probs=PROBE_CANDIDATES
    )


def _candidates(answer: Completion) -> tuple[tuple[int, float], ...]:
    """The first generated token's candidates, ``(token id, log-probability)``."""
    if not answer.completion_probabilities:
        return ()
    return tuple((c.id, c.logprob) for c in answer.completion_probabilities[0].top_logprobs)


def _same_candidates(
    replayed: Sequence[tuple[int, float]], recorded: Sequence[tuple[int, float]]
) -> bool:
    """The same candidates in the same order, each log-probability within the tolerance."""
    return (
        bool(recorded)
        and len(replayed) == len(recorded)
        and all(
            token == expected and abs(logprob - expected_logprob) <= LOGPROB_TOLERANCE
            for (token, logprob), (expected, expected_logprob) in zip(
                replayed, recorded, strict=True
            )
        )
    )


async def _exercise(handle: LlamaHandle, slot: int, filename: str) -> tuple[str, Canary]:
    """Steps 1-6 in ``slot``; returns the pass reason and this generation's canary record."""
    _require(await slot_is_idle(handle, slot), f"state slot {slot} is busy")
    await erase_slot(handle, slot)
    tokens = await tokenize(handle, PROBE_TEXT + secrets.token_hex(3))
    head = await complete_in_slot(handle, slot, tokens[:-1], n_predict=0)
    _require(
        head.timings.cache_n == 0,
        f"a freshly erased slot reported {head.timings.cache_n} reused tokens: "
        "a cache outside the slot is answering",
    )
    first = await _probe_run(handle, slot, tokens)
    candidates = _candidates(first)
    _require(bool(candidates), "llama-server reported no candidates for the generated token")
    _require(
        first.timings.cache_n == len(tokens) - 1,
        f"the live slot gave {first.timings.cache_n} of {len(tokens) - 1} evaluated tokens back",
    )
    saved = await save_slot(handle, slot, filename)
    path = handle.slot_dir / filename
    size = await anyio.to_thread.run_sync(lambda: os.lstat(path).st_size)
    _require(size == saved.n_written, f"the slot file has {size} bytes, not n_written")
    _require(
        len(tokens) <= saved.n_saved <= len(tokens) + first.tokens_predicted,
        f"slot save reported {saved.n_saved} tokens for a {len(tokens)}-token prompt",
    )
    erased = await erase_slot(handle, slot)
    _require(erased == saved.n_saved, f"erase removed {erased} tokens, not {saved.n_saved}")
    _require(await erase_slot(handle, slot) == 0, "the slot was not empty after erase")
    restored = await restore_slot(handle, slot, filename)
    _require(
        restored.n_restored == saved.n_saved and restored.n_read == saved.n_written,
        f"restore acknowledged {restored.n_restored} tokens / {restored.n_read} bytes, "
        f"the save {saved.n_saved} / {saved.n_written}",
    )
    replay = await _probe_run(handle, slot, tokens)
    _require(replay.content == first.content, "the replay's greedy output differs")
    _require(
        _same_candidates(_candidates(replay), candidates),
        "the replay's candidate tokens or their log-probabilities differ",
    )
    _require(
        replay.timings.cache_n >= len(tokens) - 1,
        f"the replay reused {replay.timings.cache_n} of {len(tokens)} prompt tokens: "
        "the restored slot was not used",
    )
    reason = (
        f"the functional state probe passed for process generation {handle.generation}: "
        f"save/erase/restore of {saved.n_saved} tokens, replay reused "
        f"{replay.timings.cache_n} and reproduced the greedy output"
    )
    digest = await anyio.to_thread.run_sync(lambda: sha256_file(path))
    return reason, Canary(
        generation=handle.generation,
        tokens=tuple(tokens),
        content=first.content,
        n_predict=PROBE_GENERATED,
        n_saved=saved.n_saved,
        n_written=saved.n_written,
        sha256=digest,
        top_logprobs=candidates,
    )


async def _prefix_step(
    handle: LlamaHandle, slot: int, filename: str, tokens: Sequence[int]
) -> ProbeResult:
    """Step 7: continue the restored probe state with a longer prompt (see the module
    docstring); never raises for an observation."""
    try:
        extended = [*tokens, *await tokenize(handle, PROBE_SUFFIX)]
        # The cold run evaluates in the chunks the continued one will have: the prompt but its
        # last token, that token, the suffix but its last token, then the last one (CPU kernels
        # round differently for different batch shapes; see step 2).
        await erase_slot(handle, slot)
        for part in (tokens[:-1], tokens, extended[:-1]):
            await complete_in_slot(handle, slot, part, n_predict=0)
        cold = await _probe_run(handle, slot, extended)
        await erase_slot(handle, slot)
        await restore_slot(handle, slot, filename)
        head = await complete_in_slot(handle, slot, extended[:-1], n_predict=0)
        _require(
            len(tokens) <= head.timings.cache_n < len(extended) - 1,
            f"continuing the restored {len(tokens)}-token prefix reused {head.timings.cache_n} "
            f"tokens of {len(extended) - 1}",
        )
        continued = await _probe_run(handle, slot, extended)
        _require(
            continued.content == cold.content
            and _same_candidates(_candidates(continued), _candidates(cold)),
            "the continued prefix gave other output or candidates than a cold run of the "
            "same prompt",
        )
    except (_ProbeFailed, LlamaRefused) as exc:
        return ProbeResult(ProbeStatus.FAILED, str(exc))
    except WerkError as exc:
        return ProbeResult(ProbeStatus.FAILED, exc.message)
    return ProbeResult(
        ProbeStatus.PASSED,
        f"a restored {len(tokens)}-token state continued with {len(extended) - len(tokens)} "
        f"more tokens reused {head.timings.cache_n}, evaluated the rest and reproduced a cold "
        f"run (process generation {handle.generation})",
    )


async def _cross_restart(handle: LlamaHandle, slot: int, own_file: str, own: Canary) -> ProbeResult:
    """The cross-restart step (see the module docstring); never raises for an observation."""
    if not handle.lineage:
        return ProbeResult(ProbeStatus.FAILED, "this process's slot-file lineage is unknown")
    lineage = handle.lineage
    canary = await anyio.to_thread.run_sync(load_canary, lineage)

    async def keep_own(reason: str) -> ProbeResult:
        path = handle.slot_dir / own_file
        await anyio.to_thread.run_sync(lambda: store_canary(lineage, path, own))
        return ProbeResult(ProbeStatus.FAILED, reason)

    if canary is None or canary.generation == handle.generation:
        return await keep_own(
            "no earlier process generation with this envelope left a canary to restore; "
            f"generation {handle.generation} left one for the next"
        )
    target = handle.slot_dir / new_slot_filename("canary")
    why = await anyio.to_thread.run_sync(lambda: verified_slot_file(lineage, canary, target))
    if why is not None:
        return await keep_own(why)
    try:
        await erase_slot(handle, slot)
        restored = await restore_slot(handle, slot, target.name)
        _require(
            restored.n_restored == canary.n_saved and restored.n_read == canary.n_written,
            f"the canary of generation {canary.generation} restored {restored.n_restored} "
            f"tokens / {restored.n_read} bytes, not {canary.n_saved} / {canary.n_written}",
        )
        tokens = list(canary.tokens)
        replay = await _probe_run(handle, slot, tokens, n_predict=canary.n_predict)
        _require(
            replay.content == canary.content,
            f"the canary of generation {canary.generation} replayed to a different greedy output",
        )
        _require(
            _same_candidates(_candidates(replay), canary.top_logprobs),
            f"the canary of generation {canary.generation} replayed to other candidate tokens "
            "or log-probabilities",
        )
        _require(
            replay.timings.cache_n >= len(tokens) - 1,
            f"the canary replay reused {replay.timings.cache_n} of {len(tokens)} prompt tokens",
        )
    except (_ProbeFailed, LlamaRefused) as exc:
        return await keep_own(str(exc))
    except WerkError as exc:
        return await keep_own(exc.message)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(lambda: target.unlink(missing_ok=True))
    return ProbeResult(
        ProbeStatus.PASSED,
        f"a slot file saved by generation {canary.generation} restored into generation "
        f"{handle.generation}, reused {replay.timings.cache_n} of {len(tokens)} prompt tokens "
        "and reproduced its greedy output",
    )


async def run_probe(handle: LlamaHandle) -> ProbeResult:
    """Run the probe against ``handle``'s process. The caller holds ``handle.slot_lock``.

    Never raises for a failed observation: it returns ``ProbeResult(FAILED, reason)``.
    """
    try:
        _check_preconditions(handle)
        await _check_total_slots(handle)
    except (_ProbeFailed, LlamaRefused) as exc:
        return ProbeResult(ProbeStatus.FAILED, str(exc))
    except WerkError as exc:
        return ProbeResult(ProbeStatus.FAILED, exc.message)
    except OSError as exc:
        return ProbeResult(ProbeStatus.FAILED, f"the slot directory is unusable ({exc.strerror})")
    allocator = allocator_for(handle)
    slot, _ = allocator.acquire()
    filename = new_slot_filename("probe")
    try:
        reason, own = await _exercise(handle, slot, filename)
        result = ProbeResult(ProbeStatus.PASSED, reason)
        handle.prefix = await _prefix_step(handle, slot, filename, own.tokens)
        handle.cross_restart = await _cross_restart(handle, slot, filename, own)
    except (_ProbeFailed, LlamaRefused) as exc:
        result = ProbeResult(ProbeStatus.FAILED, str(exc))
    except WerkError as exc:
        result = ProbeResult(ProbeStatus.FAILED, exc.message)
    except OSError as exc:
        result = ProbeResult(ProbeStatus.FAILED, f"the slot file is unusable ({exc.strerror})")
    finally:
        with anyio.CancelScope(shield=True):
            await _clean_up(handle, slot, filename)
            allocator.retire(slot)
    if result.status is ProbeStatus.FAILED:
        handle.cross_restart = ProbeResult(ProbeStatus.FAILED, result.reason)
        handle.prefix = ProbeResult(ProbeStatus.FAILED, result.reason)
        log.warning("llama-server %s failed the state probe: %s", handle.generation, result.reason)
    return result


async def _clean_up(handle: LlamaHandle, slot: int, filename: str) -> None:
    try:
        await erase_slot(handle, slot)
    except (WerkError, LlamaRefused):
        log.warning("could not erase probe slot %s of %s", slot, handle.generation)
    path = handle.slot_dir / filename
    await anyio.to_thread.run_sync(lambda: path.unlink(missing_ok=True))


async def ensure_probed(handle: LlamaHandle) -> ProbeResult:
    """The generation's probe result, running the probe first if it has not run.

    Takes ``handle.slot_lock``; a concurrent caller waits and sees the first caller's result.
    """
    async with handle.slot_lock:
        if handle.probe.status is ProbeStatus.NOT_RUN:
            handle.probe = await run_probe(handle)
        return handle.probe


def start_early_probe(handle: LlamaHandle) -> asyncio.Task[ProbeResult] | None:
    """A background task that runs :func:`ensure_probed` at once when an earlier generation of
    ``handle``'s lineage left a canary (see "When it runs"), and otherwise does nothing.

    Synchronous, so that a start cannot be cancelled between making the process and owning the
    task. The caller cancels and awaits the task before it stops the process."""
    if not handle.lineage or handle.probe.status is not ProbeStatus.NOT_RUN:
        return None
    return asyncio.ensure_future(_probe_early(handle, handle.lineage))


async def _probe_early(handle: LlamaHandle, lineage: str) -> ProbeResult:
    canary = await anyio.to_thread.run_sync(load_canary, lineage)
    if canary is None or canary.generation == handle.generation:
        return handle.probe  # nothing to prove against: the first Prefill runs the probe
    try:
        result = await ensure_probed(handle)
    except Exception:  # in the background: logged; the probe stays not run for the next Prefill
        log.exception("the early state probe of llama-server %s failed", handle.generation)
        return handle.probe
    log.info(
        "early state probe of %s: %s; cross-restart: %s",
        handle.generation,
        result.status.value,
        handle.cross_restart.reason,
    )
    return result
