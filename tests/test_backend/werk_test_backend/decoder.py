"""TEST CODE: the deterministic ``testkv`` decoder and the magic prompt markers.

Generation is a pure function of the model's weights digest and the evaluated tokens: with
``seed = sha256(weights || tokens)``, step ``i`` emits the vocabulary word at index
``sha256(seed || i) mod len(vocab)`` (preceded by a space after the first word), and the text
ends on its own (``finish_reason = "stop"``) after ``3 + seed[0] % 14`` words — 3 to 16. One
word is one completion token. ``max_tokens`` cuts it earlier (``"length"``); the first ``stop``
sequence that appears truncates the text before it (``"stop"``, the word that produced it still
counted). ``temperature`` and ``seed`` are accepted and ignored.

Markers in the evaluated text simulate misbehaving backends:

* ``<<fail-prefill>>`` — prefill raises a plain :class:`RuntimeError`;
* ``<<fail-decode>>`` — decode (and ``/v1`` generation) raises a plain :class:`RuntimeError`;
  a streaming ``/v1`` reply raises it after its first chunk;
* ``<<huge>>`` — decode returns exactly ``1 MiB + 1`` bytes of ASCII text (ignoring
  ``max_tokens`` and ``stop``), one byte over the host's completion bound.

The simulated failures carry :data:`FAILURE_DETAIL`, an absolute-looking path, in their message
so that tests can prove backend error text never reaches a client.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from werk.protocol import FinishReason

__all__ = [
    "FAILURE_DETAIL",
    "FAIL_DECODE",
    "FAIL_PREFILL",
    "HUGE",
    "HUGE_COMPLETION_BYTES",
    "MAX_NATURAL_WORDS",
    "MIN_NATURAL_WORDS",
    "Generation",
    "generate",
]

FAIL_PREFILL = "<<fail-prefill>>"
FAIL_DECODE = "<<fail-decode>>"
HUGE = "<<huge>>"
HUGE_COMPLETION_BYTES = 1024 * 1024 + 1
FAILURE_DETAIL = "/testkv/secret/internal-failure-detail"
MIN_NATURAL_WORDS = 3
MAX_NATURAL_WORDS = 16

_HUGE_PATTERN = "huge "


@dataclass(frozen=True, kw_only=True)
class Generation:
    """A finished completion."""

    text: str
    finish_reason: FinishReason
    completion_tokens: int


def _earliest_stop(text: str, stops: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def generate(
    *,
    weights_digest: str,
    vocab: Sequence[str],
    tokens: bytes,
    max_tokens: int,
    stop: Sequence[str] = (),
) -> Generation:
    """Generate the completion of ``tokens`` (see the module docstring).

    :raises RuntimeError: the tokens contain ``<<fail-decode>>``.
    """
    if FAIL_DECODE.encode() in tokens:
        raise RuntimeError(f"testkv: simulated decode failure {FAILURE_DETAIL}")
    if HUGE.encode() in tokens:
        reps = HUGE_COMPLETION_BYTES // len(_HUGE_PATTERN) + 1
        text = (_HUGE_PATTERN * reps)[:HUGE_COMPLETION_BYTES]
        return Generation(text=text, finish_reason=FinishReason.LENGTH, completion_tokens=reps)
    seed = hashlib.sha256(weights_digest.encode() + b"\0" + tokens).digest()
    natural = MIN_NATURAL_WORDS + seed[0] % (MAX_NATURAL_WORDS - MIN_NATURAL_WORDS + 1)
    text = ""
    for step in range(natural):
        if step >= max_tokens:
            return Generation(text=text, finish_reason=FinishReason.LENGTH, completion_tokens=step)
        pick = hashlib.sha256(seed + step.to_bytes(4, "big")).digest()
        word = vocab[int.from_bytes(pick[:8], "big") % len(vocab)]
        text += word if step == 0 else " " + word
        cut = _earliest_stop(text, stop)
        if cut is not None:
            return Generation(
                text=text[:cut], finish_reason=FinishReason.STOP, completion_tokens=step + 1
            )
    return Generation(text=text, finish_reason=FinishReason.STOP, completion_tokens=natural)
