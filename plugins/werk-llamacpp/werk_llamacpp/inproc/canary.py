"""Cross-restart proof for ``llamacpp-inproc``: does a state saved by an earlier ``werk serve``
process restore to the same continuation in this one?

Each runtime generation whose state probe passed evaluates a fixed prompt, saves the sequence
(the same bytes a disk state holds, :func:`~werk_llamacpp.inproc.states.encode`), restores it
and generates greedily. It compares that with the **canary** an earlier generation of the same
*lineage* left (the envelope without generation and principal: the llama.cpp library's
fingerprint, the model identity, the context settings and the state layout —
:func:`werk_llamacpp.canary.lineage_of`): the earlier state restored here must hold the same
tokens and continue with the same token ids. Only then is
``runtime.state.restore.cross_restart`` ``experimental`` for this generation.

Canaries live privately under ``WERK_HOME/canaries/llamacpp-inproc/<lineage>/`` (``state.bin``
and ``canary.json``, each replaced atomically). A lineage without one gets this generation's; a
canary that failed to verify is replaced by it. A damaged ``state.bin`` fails the proof (its own
checksum), never the start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from werk import BackendError, Runtime, StateProbe, werk_home

from .. import __version__
from ..canary import lineage_of, write_canary_files
from .sessions import Saved
from .states import decode_payload, encode

if TYPE_CHECKING:
    from .engine import Engine
    from .runtime import InprocHandle

__all__ = ["prove_cross_restart"]

SCHEMA = 1
PROMPT = "A canary is kept to prove that a saved state continues the same way."
MAX_TOKENS = 4
MAX_CANARY_JSON_BYTES = 1 << 16


class Canary(msgspec.Struct, frozen=True):
    """What an earlier generation recorded beside its ``state.bin``."""

    generation: str
    ids: tuple[int, ...]


def _lineage(runtime: Runtime) -> str:
    return lineage_of(
        executable=runtime.executable,
        model_identity=runtime.model.identity,
        args=runtime.args,
        cache_layout=runtime.cache_layout,
        adapter=f"werk-llamacpp {__version__} inproc",
    )


def _directory(lineage: str) -> Path:
    return werk_home() / "canaries" / "llamacpp-inproc" / lineage


def _load(lineage: str) -> tuple[Canary, bytes] | None:
    directory = _directory(lineage)
    try:
        record = json.loads((directory / "canary.json").read_bytes()[:MAX_CANARY_JSON_BYTES])
        if record.get("schema") != SCHEMA:
            return None
        canary = Canary(
            generation=str(record["generation"]), ids=tuple(int(i) for i in record["ids"])
        )
        return canary, (directory / "state.bin").read_bytes()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _store(lineage: str, canary: Canary, payload: bytes) -> None:
    """Record this generation's canary (best effort: a failure only costs the next proof)."""
    record = {"schema": SCHEMA, "generation": canary.generation, "ids": list(canary.ids)}
    write_canary_files(
        _directory(lineage),
        {"state.bin": lambda: payload, "canary.json": lambda: json.dumps(record).encode()},
    )


def _continue(engine: Engine, saved: Saved) -> tuple[int, ...]:
    """The greedy token ids after restoring ``saved`` (the path a disk state's decode takes)."""
    engine.restore(saved)
    events = engine.generation(
        list(saved.tokens), max_tokens=MAX_TOKENS, temperature=0.0, sessions=False
    )
    return tuple(int(i) for event in events for i in event.get("ids", ()))


async def prove_cross_restart(runtime: Runtime) -> StateProbe:
    """Verify an earlier generation's canary and leave this one's; never raises."""
    handle: InprocHandle = runtime.handle
    engine = handle.engine
    lineage = _lineage(runtime)
    found = _load(lineage)

    def result(passed: bool, reason: str) -> StateProbe:
        return StateProbe(passed=passed, reason=reason, generation=runtime.generation)

    def work() -> tuple[Saved, tuple[int, ...], str | None]:
        tokens = engine.prompt_tokens(PROMPT)
        engine.clear()
        engine.evaluate(tokens)
        own = engine.save()
        ids = _continue(engine, own)
        if found is None:
            return own, ids, None
        canary, payload = found
        try:
            earlier = decode_payload(payload)
            if earlier.tokens != own.tokens:
                return own, ids, "the canary holds other tokens than this generation's prompt"
            replayed = _continue(engine, earlier)
        except BackendError as exc:
            return own, ids, f"the canary of generation {canary.generation} was refused: {exc}"
        if replayed != canary.ids or replayed != ids:
            return (
                own,
                ids,
                (
                    f"the state of generation {canary.generation} continued with {list(replayed)}, "
                    f"there with {list(canary.ids)}, a fresh state here with {list(ids)}"
                ),
            )
        return own, ids, ""

    try:
        own, ids, verdict = await handle.lane.run(work)
    except Exception as exc:
        return result(False, f"the cross-restart probe raised {type(exc).__name__}: {exc}")
    if not ids:
        return result(False, "the cross-restart probe generated nothing to compare")
    if verdict == "" and found is not None:
        return result(
            True,
            f"a state saved by generation {found[0].generation} restored in generation "
            f"{runtime.generation} and continued identically",
        )
    _store(lineage, Canary(generation=runtime.generation, ids=ids), encode(own))
    if verdict is None:
        return result(
            False,
            "no earlier werk serve process left a canary for this model, library and settings "
            "yet; the next start proves cross-restart restore",
        )
    return result(False, f"cross-restart probe failed: {verdict}")
