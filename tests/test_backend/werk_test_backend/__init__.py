"""TEST CODE: the ``testkv`` Werk backend (distribution ``werk-test-backend``).

This plugin is never loaded by default; installed only by the test suite. It exists so that the
whole control plane (capability gating, prefill, snapshot into the state catalog, restore,
decode, handoffs, ``/v1``) can be exercised end to end with *real* opaque states — bytes and
files — before a real inference backend is available. It evaluates no neural network.

How it behaves (details in each module):

* **Model** (:mod:`.engine`): a UTF-8 text file, ``ModelSpec.files[0]``. Its whitespace words are
  the vocabulary and its SHA-256 the "weights" digest. ``start`` builds an in-process
  :class:`~.engine.Engine` (no subprocess) with a fresh generation ``g_<hex>``.
* **Tokens**: one token per UTF-8 byte of the evaluated text (chat ``messages`` are rendered with
  :func:`~.kvstate.render_messages`).
* **State** (:mod:`.kvstate`): a live :class:`~.kvstate.KVState` (``handle`` states) or its byte
  encoding — header with the generation, then the tokens, then a SHA-256 trailer — in a ``file``
  payload. Reuse reports the real common-prefix length as ``cached_tokens``.
* **Decode** (:mod:`.decoder`): deterministic words chosen by hashing weights and tokens.
* **Simulated failures** (all documented in :mod:`.engine` and :mod:`.decoder`): ``kill()`` on
  the runtime's handle or a ``<model file>.kill`` file kills the runtime; the prompt markers
  ``<<fail-prefill>>``, ``<<fail-decode>>`` and ``<<huge>>``; ``<<fail-start>>`` in the model
  file; a ``<model file>.hold`` file makes a start wait while it exists (a slow load).

It imports only public names from :mod:`werk` (and :mod:`werk.protocol`).
"""

from .decoder import FAIL_DECODE, FAIL_PREFILL, FAILURE_DETAIL, HUGE, HUGE_COMPLETION_BYTES
from .engine import FAIL_START, Engine, kill_file
from .kvstate import KVState, render_messages
from .plugin import BACKEND, CACHE_LAYOUT

__all__ = [
    "BACKEND",
    "CACHE_LAYOUT",
    "FAILURE_DETAIL",
    "FAIL_DECODE",
    "FAIL_PREFILL",
    "FAIL_START",
    "HUGE",
    "HUGE_COMPLETION_BYTES",
    "Engine",
    "KVState",
    "__version__",
    "kill_file",
    "render_messages",
]

__version__ = "0.1.0"
