"""Werk's reference runner for backend ``onnx-runner``: ONNX Runtime GenAI, one process per
request, speaking Werk's runner contract (:mod:`werk.runner`). Run by the onnx environment's
python, never imported by Werk; any program that speaks the contract can take its place.

stdin: one JSON object — the model folder in ``model`` and the generation arguments
(``messages`` or ``prompt``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``return_token_ids``). stdout: ``{"delta": TEXT, "ids": [...]}`` lines, then ``{"done": true,
...}``; or ``{"error": TEXT[, "kind": "invalid"]}`` and exit status 1 (2 for ``invalid``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from _genai import Loaded, generate  # this script's own folder


def _emit(line: dict[str, Any]) -> None:
    sys.__stdout__.write(json.dumps(line) + "\n")
    sys.__stdout__.flush()


def main() -> int:
    request = json.loads(sys.stdin.readline())
    sys.stdout = sys.stderr  # whatever the libraries print goes to the log, not the protocol
    loaded = Loaded(str(request["model"]))
    events = generate(loaded, request)
    while True:
        try:
            event = next(events)
        except StopIteration as stop:
            result = dict(stop.value or {})
            break
        _emit({"delta": event["text"], "ids": event["ids"]})
    if "refused" in result:
        _emit({"error": result["refused"], "kind": "invalid"})
        return 2
    _emit({"done": True, **result})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # reported on the protocol; the traceback goes to the log
        import traceback

        traceback.print_exc()
        _emit({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)
