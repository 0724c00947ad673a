"""Werk's reference runner for backend ``onnx-runner``: ONNX Runtime GenAI, one process per
request, speaking Werk's runner contract (:mod:`werk.runner`). Run by the onnx environment's
python, never imported by Werk; any program that speaks the contract can take its place.

stdin: one JSON object — the model folder in ``model`` and the generation arguments
(``messages`` or ``prompt``, ``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``,
``return_token_ids``). stdout: ``{"delta": TEXT, "ids": [...]}`` lines, then ``{"done": true,
...}``; or ``{"error": TEXT[, "kind": "invalid"]}`` and exit status 1 (2 for ``invalid``):
``werk_companion_frames.run_once`` does that part.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
from _genai import Loaded, generate
from werk_companion_frames import run_once

if __name__ == "__main__":
    run_once(lambda request: generate(Loaded(str(request["model"])), request))
