"""Cross-restart canaries: the evidence that a slot file saved by one llama-server process
restores correctly into another started the same way.

A process generation whose functional probe passed leaves a **canary** for its *lineage* — the
digest of everything that determines the KV layout of a slot file, i.e. the state envelope
without the process generation and the principal (see :func:`lineage_of`): its probe slot file,
the prompt's tokens, the greedy text the probe generated, that token's most likely candidates
with their log-probabilities, and how many tokens the save held. A later generation of the same
lineage restores that file into a state slot, replays the prompt and must reproduce the text and
the candidates with the prefix reused (``timings.cache_n``): only then is
``runtime.state.restore.cross_restart`` ``experimental`` for it.

Canaries live privately under ``WERK_HOME/canaries/llamacpp/<lineage>/`` (``0700``;
``slot.bin`` and ``canary.json``, each replaced atomically), never in a principal's store. The
JSON records the slot file's SHA-256; a file that does not match it is a failed proof, never a
crash. A canary is written when its lineage has none, and replaced when one failed to verify.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import msgspec

from werk import replace_private_file, werk_home

from .inspect import sha256_file

__all__ = [
    "Canary",
    "canary_dir",
    "lineage_of",
    "load_canary",
    "store_canary",
    "verified_slot_file",
    "write_canary_files",
]

SCHEMA = 3
"""3: the candidates' log-probabilities were added; a canary of an older schema is ignored
(the next probe replaces it)."""
MAX_CANARY_JSON_BYTES = 1 << 20


def lineage_of(
    *, executable: str, model_identity: str, args: Sequence[str], cache_layout: str, adapter: str
) -> str:
    """The lineage digest: executable fingerprint, model identity, the effective (public)
    arguments, the slot layout and the adapter version — what a restored slot file depends on."""
    canonical = json.dumps(
        {
            "executable": executable,
            "model_identity": model_identity,
            "args": list(args),
            "cache_layout": cache_layout,
            "adapter": adapter,
        },
        sort_keys=True,
    ).encode()
    return hashlib.sha256(canonical).hexdigest()[:32]


class Canary(msgspec.Struct, frozen=True):
    """What an earlier generation recorded with its slot file.

    :ivar generation: the generation that saved it.
    :ivar tokens: the probe prompt's tokens.
    :ivar content: the greedy text generated from them (the replay must reproduce it).
    :ivar n_predict: how many tokens that text is.
    :ivar top_logprobs: the first generated token's most likely candidates, ``(token id,
        log-probability)``, most likely first (the replay must reproduce them).
    :ivar n_saved: tokens the save held; :ivar n_written: bytes of the slot file.
    :ivar sha256: digest of the slot file.
    """

    generation: str
    tokens: tuple[int, ...]
    content: str
    n_predict: int
    n_saved: int
    n_written: int
    sha256: str
    top_logprobs: tuple[tuple[int, float], ...] = ()


def canary_dir(lineage: str) -> Path:
    return werk_home() / "canaries" / "llamacpp" / lineage


def load_canary(lineage: str) -> Canary | None:
    """The lineage's canary record, or ``None`` when there is none (or it is unreadable)."""
    path = canary_dir(lineage) / "canary.json"
    try:
        raw = path.read_bytes()[:MAX_CANARY_JSON_BYTES]
        record = json.loads(raw)
        if record.get("schema") != SCHEMA:
            return None
        return Canary(
            generation=str(record["generation"]),
            tokens=tuple(int(t) for t in record["tokens"]),
            content=str(record["content"]),
            n_predict=int(record["n_predict"]),
            n_saved=int(record["n_saved"]),
            n_written=int(record["n_written"]),
            sha256=str(record["sha256"]),
            top_logprobs=tuple((int(i), float(lp)) for i, lp in record["top_logprobs"]),
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def verified_slot_file(lineage: str, canary: Canary, target: Path) -> str | None:
    """Copy the canary's slot file to ``target`` if it matches its record; else the reason."""
    source = canary_dir(lineage) / "slot.bin"
    try:
        shutil.copyfile(source, target)
        if sha256_file(target) != canary.sha256 or target.stat().st_size != canary.n_written:
            target.unlink(missing_ok=True)
            return "the canary's slot file does not match its recorded digest"
    except OSError as exc:
        target.unlink(missing_ok=True)
        return f"the canary's slot file is unreadable ({exc.strerror})"
    return None


def write_canary_files(directory: Path, files: Mapping[str, Callable[[], bytes]]) -> None:
    """Replace each file of ``files`` (name → its bytes, read when written) in ``directory``
    (created ``0700``) atomically, in order; best effort: a failure only costs the next proof,
    and the record written last never describes a payload that was not replaced."""
    with contextlib.suppress(OSError):
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            for name, data in files.items():
                replace_private_file(dir_fd, name, data())
        finally:
            os.close(dir_fd)


def store_canary(lineage: str, slot_file: Path, canary: Canary) -> None:
    """Record ``slot_file`` (a probe's save) as the lineage's canary (best effort)."""
    record = {
        "schema": SCHEMA,
        **msgspec.structs.asdict(canary),
        "tokens": list(canary.tokens),
        "top_logprobs": [list(pair) for pair in canary.top_logprobs],
    }
    write_canary_files(
        canary_dir(lineage),
        {"slot.bin": slot_file.read_bytes, "canary.json": lambda: json.dumps(record).encode()},
    )
