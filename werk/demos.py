"""Demo models that plugins can generate locally (``werk models create-demo --kind KIND``).

No model weights can be downloaded in many places Werk runs (and a demo should not need a
download anyway), so each backend plugin that can serve a tiny generated model offers a
:class:`DemoModel` through :func:`~werk.hookspecs.werk_demo_models`. The host command writes the
files with the plugin's ``create`` and imports them into the model registry for the plugin's
backend, exactly as ``werk models import`` would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

__all__ = ["DemoModel", "DemoRequest", "tiny_llama_script"]

_KIND = re.compile(r"^[a-z][a-z0-9-]{0,31}$")


class DemoRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the user asked ``create-demo`` for.

    :ivar model_id: the id the model will be imported as.
    :ivar home: the active ``WERK_HOME`` (default outputs go under ``home/models/files``).
    :ivar output: ``--output`` when given (a file or a directory, as the kind documents).
    :ivar seed: the weights seed: the same seed must give the same bytes (and identity).
    :ivar size: ``--size`` (each kind documents the sizes it offers; ``tiny`` always works).
    :ivar progress: prints one line of progress on stderr (long generations should use it).
    """

    model_id: str
    home: Path
    output: Path | None = None
    seed: int = 0
    size: str = "tiny"
    progress: Callable[[str], None] = msgspec.field(default=lambda line: None)


class DemoModel(msgspec.Struct, frozen=True, kw_only=True):
    """One kind of demo model a plugin can generate.

    :ivar kind: the ``--kind`` name (lower-case, e.g. ``gguf``, ``vllm``).
    :ivar backend: the backend it is imported for.
    :ivar description: one line for ``werk models create-demo --help`` and the error listing
        the kinds.
    :ivar create: writes the files (idempotent: unchanged files may be kept) and returns them;
        raises :class:`werk.InvalidRequest` for a bad size or output. Called in the ``werk``
        process.
    :ivar options: manifest options to import the model with.
    """

    kind: str
    backend: str
    description: str
    create: Callable[[DemoRequest], Sequence[Path]]
    options: Mapping[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _KIND.match(self.kind):
            raise ValueError(f"demo kind {self.kind!r} must be lower-case [a-z0-9-], 1-32 chars")


def tiny_llama_script() -> Path:
    """The host's tiny-Llama writer, for a plugin's ``create`` to run with its own environment's
    python (it needs torch, Transformers and tokenizers; no download)::

        python SCRIPT TARGET_DIR SEED

    writes a ``save_pretrained`` directory — a random ``LlamaForCausalLM`` (hidden 64, 2 layers,
    a 2,048-token context), a byte-level BPE tokenizer trained on a built-in corpus, a chat
    template — byte-identical for a seed, and prints the files it wrote. Every backend that
    converts or loads it (Transformers, ONNX Runtime GenAI, MLX) starts from the same weights,
    so their greedy token ids can be compared.
    """
    return Path(__file__).with_name("_demo") / "tiny_llama.py"
