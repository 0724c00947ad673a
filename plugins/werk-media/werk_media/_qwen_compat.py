"""Make ``import qwen_tts`` work where torchaudio cannot load. Run by the Qwen3-TTS python
(imported by ``_worker.py`` and ``_tiny_qwen_tts.py``; never by Werk).

qwen-tts 0.1.1 imports ``torchaudio.compliance.kaldi`` at package import time, but uses it only
in the 25 Hz speech tokenizer (voice cloning from reference audio). PyPI's torchaudio does not
load beside the CPU torch build Werk installs, so when it cannot be imported, :func:`install`
puts a stand-in package in ``sys.modules`` whose every use raises a clear error: the 12 Hz path
(custom voices) works, and the 25 Hz path fails with that error instead of crashing the import.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

__all__ = ["install", "torchaudio_problem"]

_problem: str | None = None


def torchaudio_problem() -> str | None:
    """Why torchaudio is unavailable (``None`` when it loads), after :func:`install`."""
    return _problem


def _refusing_module(name: str, problem: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []

    def refuse(attribute: str) -> object:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise RuntimeError(
            f"{name}.{attribute} is unavailable: torchaudio does not load here ({problem}); "
            "the 25 Hz voice-cloning path needs it"
        )

    module.__getattr__ = refuse  # type: ignore[method-assign]
    return module


def install() -> str | None:
    """Import torchaudio's Kaldi module, or put the stand-in in place; returns the problem."""
    global _problem
    try:
        import torchaudio.compliance.kaldi  # noqa: F401
    except Exception as exc:  # ImportError, or an OSError/RuntimeError from its libraries
        _problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    else:
        _problem = None
        return None
    for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
        del sys.modules[name]
    package = _refusing_module("torchaudio", _problem)
    compliance = _refusing_module("torchaudio.compliance", _problem)
    kaldi = _refusing_module("torchaudio.compliance.kaldi", _problem)
    package.compliance = compliance  # type: ignore[attr-defined]
    compliance.kaldi = kaldi  # type: ignore[attr-defined]
    sys.modules.update(
        {"torchaudio": package, "torchaudio.compliance": compliance, kaldi.__name__: kaldi}
    )
    return _problem
