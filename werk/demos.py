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

__all__ = ["DemoModel", "DemoRequest"]

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
