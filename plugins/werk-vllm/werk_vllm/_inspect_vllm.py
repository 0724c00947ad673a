"""Run by the vLLM environment's python (never imported by Werk): what this vLLM offers.

Prints one line ``WERK-INSPECT {json}`` on stdout: vLLM's version, its package path, whether
its OpenAI chat and completion requests accept ``cache_salt``, and the text of the OpenAI
server's own ``--help=all`` (the flags it advertises: plain ``--help`` omits most of them).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import runpy
import sys

SERVER = "vllm.entrypoints.openai.api_server"
REQUESTS = (  # (module, class) across vLLM layouts: 0.32 first, then the older single module
    ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),
    ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),
    ("vllm.entrypoints.openai.protocol", "ChatCompletionRequest"),
    ("vllm.entrypoints.openai.protocol", "CompletionRequest"),
)


def _accepts_cache_salt() -> dict[str, bool]:
    found: dict[str, bool] = {}
    for module_name, class_name in REQUESTS:
        if class_name in found:
            continue
        try:
            request = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            continue
        found[class_name] = "cache_salt" in getattr(request, "model_fields", {})
    return found


def main() -> None:
    import vllm

    report: dict[str, object] = {
        "version": str(vllm.__version__),
        "package": str(vllm.__file__),
        "cache_salt": _accepts_cache_salt(),
    }
    text = io.StringIO()
    sys.argv = [SERVER, "--help=all"]
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        runpy.run_module(SERVER, run_name="__main__", alter_sys=True)
    report["help"] = text.getvalue()
    print("WERK-INSPECT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
