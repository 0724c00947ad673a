"""TEST CODE: the in-process ``testkv`` runtime (no subprocess) and how tests kill it.

``start(spec)`` reads the model file ``spec.files[0]`` (UTF-8 text, at most 16 MiB): its
whitespace-separated words, de-duplicated in order, are the vocabulary and the SHA-256 of its bytes
is the "weights" digest. It returns a :class:`werk.Runtime` with a fresh generation
``g_<16 hex>``, ``executable=""`` (nothing on disk to fingerprint), ``args=("--testkv",)`` and
``cache_layout="testkv-v1"``, whose ``handle`` is an :class:`Engine`. ``stop`` marks it dead and
deletes its private snapshot directory (snapshots the host has not moved away by then are gone).

**Simulating a crash.** Two ways, both observed by the *next* operation (or capability query),
which marks the runtime dead (``runtime.alive = False``) and raises :class:`werk.Unavailable`:

* in-process: ``runtime.handle.kill()``;
* across processes (a test driving a real ``werk serve``): create the file
  ``<model file>.kill`` (:func:`kill_file`). The runtime that notices it deletes it, so the next
  runtime started for that model lives.

A model file containing ``<<fail-start>>`` makes ``start`` raise a plain :class:`RuntimeError`
(an unexpected plugin failure the host must contain).
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from werk import BackendError, ModelSpec, Runtime, Unavailable

from .decoder import FAILURE_DETAIL

__all__ = [
    "ARGS",
    "BACKEND",
    "CACHE_LAYOUT",
    "FAIL_START",
    "MAX_MODEL_BYTES",
    "Engine",
    "Weights",
    "ended_file",
    "engine_of",
    "hold_file",
    "kill_file",
    "start",
    "stop",
]

BACKEND = "testkv"
CACHE_LAYOUT = "testkv-v1"
ARGS = ("--testkv",)
FAIL_START = "<<fail-start>>"
MAX_MODEL_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Weights:
    """What the model file contributes: a digest and a vocabulary of words."""

    digest: str
    vocab: tuple[str, ...]


def kill_file(model_file: Path) -> Path:
    """The file whose existence kills the runtime serving ``model_file``."""
    return model_file.with_name(model_file.name + ".kill")


def ended_file(model_file: Path) -> Path:
    """A file whose existence makes the next ``/v1`` call find its runtime ended before the
    request reached it (``werk.RuntimeEnded``, once: the file is consumed)."""
    return model_file.with_name(model_file.name + ".ended")


def hold_file(model_file: Path) -> Path:
    """While this file exists, a start of ``model_file``'s model waits (at most
    :data:`HOLD_MAX_SECONDS`): a slow load, for tests of what a loading model looks like."""
    return model_file.with_name(model_file.name + ".hold")


HOLD_MAX_SECONDS = 60.0


@dataclass(kw_only=True, eq=False)
class Engine:
    """The plugin's handle for one live testkv runtime.

    :ivar generation: the runtime generation (also ``Runtime.generation``).
    :ivar model: the model it serves.
    :ivar weights: the loaded "weights".
    :ivar state_dir: private directory (mode 0700) that snapshot files are written into.
    """

    generation: str
    model: ModelSpec
    weights: Weights
    state_dir: Path
    _alive: bool = field(default=True, repr=False)

    @property
    def model_file(self) -> Path:
        return self.model.files[0]

    def kill(self) -> None:
        """Simulate a crash: every later operation raises :class:`werk.Unavailable`."""
        self._alive = False

    def poll(self) -> bool:
        """Whether the runtime is still alive; consumes a pending kill file."""
        if self._alive and kill_file(self.model_file).exists():
            with contextlib.suppress(FileNotFoundError):
                kill_file(self.model_file).unlink()
            self._alive = False
        return self._alive


def engine_of(runtime: Runtime) -> Engine:
    """The live engine behind ``runtime``.

    :raises werk.BackendError: the runtime was not started by this plugin.
    :raises werk.Unavailable: the runtime died or was stopped (``runtime.alive`` becomes False).
    """
    engine = runtime.handle
    if not isinstance(engine, Engine) or engine.generation != runtime.generation:
        raise BackendError("runtime was not started by the testkv backend")
    if not runtime.alive or not engine.poll():
        runtime.alive = False
        engine.kill()
        raise Unavailable(f"testkv runtime generation {runtime.generation} is not running")
    return engine


def _load_weights(spec: ModelSpec) -> Weights:
    if not spec.files:
        raise BackendError(f"testkv model {spec.id!r} has no model file")
    try:
        with spec.files[0].open("rb") as fh:
            data = fh.read(MAX_MODEL_BYTES + 1)
    except OSError:
        raise BackendError(f"testkv cannot read the model file of {spec.id!r}") from None
    if len(data) > MAX_MODEL_BYTES:
        raise BackendError(f"testkv model file of {spec.id!r} is larger than 16 MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BackendError(f"testkv model file of {spec.id!r} is not UTF-8 text") from None
    if FAIL_START in text:
        raise RuntimeError(f"testkv: simulated start failure {FAILURE_DETAIL}")
    vocab = tuple(dict.fromkeys(text.split()))
    if not vocab:
        raise BackendError(f"testkv model file of {spec.id!r} contains no words")
    return Weights(digest="sha256:" + hashlib.sha256(data).hexdigest(), vocab=vocab)


async def start(spec: ModelSpec) -> Runtime:
    """Start an in-process testkv runtime for ``spec`` (``BackendDescriptor.start``)."""
    if spec.backend != BACKEND:
        raise BackendError(f"model {spec.id!r} is not a testkv model")
    weights = _load_weights(spec)
    deadline = time.monotonic() + HOLD_MAX_SECONDS
    while hold_file(spec.files[0]).exists() and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    generation = "g_" + secrets.token_hex(8)
    engine = Engine(
        generation=generation,
        model=spec,
        weights=weights,
        state_dir=Path(tempfile.mkdtemp(prefix=f"werk-testkv-{generation}-")),
    )
    return Runtime(
        backend=BACKEND,
        model=spec,
        generation=generation,
        handle=engine,
        executable="",
        args=ARGS,
        cache_layout=CACHE_LAYOUT,
    )


async def stop(runtime: Runtime) -> None:
    """Stop ``runtime`` (``BackendDescriptor.stop``): mark it dead, delete its snapshot dir.

    Idempotent; there is no process to reap.
    """
    runtime.alive = False
    engine = runtime.handle
    if isinstance(engine, Engine):
        engine.kill()
        shutil.rmtree(engine.state_dir, ignore_errors=True)
