"""The argument builder: the exact command line of one managed ``llama-server``.

Werk's part, in order (each optional flag only when the executable's ``--help`` advertises it)::

    -m MODEL --host 127.0.0.1 --port P --api-key K --slot-save-path DIR -np N
    [--cache-ram 0] [--no-warmup | --warmup] -c N*CTX [--alias ID] [--no-ui]

followed by the user's native arguments: the model option ``native_args`` (a list of strings),
then ``WERK_LLAMA_ARGS`` (split like a shell would). llama.cpp applies options left to right, so
trailing native arguments override Werk's defaults (``--warmup`` after ``--no-warmup``,
``-c``, ``-np``…). They can never set what isolates the child: host, port, API key(s), the slot
save directory, the model file, the API prefix, TLS, or socket sharing, in any spelling llama.cpp
accepts (``--api_key`` is ``--api-key`` to its parser; ``--port=1`` is rejected too).
``--path`` is *not* reserved: it is the static web-file directory, not the slot directory.

Warmup (seed: "Native synthetic warmup defaults to off"): ``warmup_tokens`` absent or ``0`` →
``--no-warmup``; positive → the native boolean ``--warmup`` (not a token count); an executable
without the controls keeps its own default.

Model options (all optional; unknown keys are rejected)::

    {"llama_server": PATH, "native_args": [...], "warmup_tokens": 0, "parallel": 4,
     "ctx_size": 4096, "startup_timeout": 300, "state_slots": 1,
     "state_hold_seconds": 900, "state_wait_seconds": 30, "embeddings": false}

``parallel`` is the number of slots for ``/v1`` traffic; ``state_slots`` more slots are
reserved for named states and the functional probe. ``ctx_size`` is the context of *each* slot
(llama-server divides ``-c`` among the slots when ``-np`` is explicit), so every state slot
costs one slot's KV cache. A prefilled state is kept for its decode for up to
``state_hold_seconds`` (a handoff's lifetime; spilled to a file when its slot is needed first),
and a state request waits in line for the state slots at most ``state_wait_seconds``
(:mod:`werk_llamacpp.slot_allocator`). ``embeddings: true`` starts llama-server with
``--embeddings --pooling mean`` (unless ``native_args`` choose a pooling), so the model also
answers ``/v1/embeddings``.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from werk import CapabilityId, InvalidRequest, ModelSpec, Unavailable

from .inspect import Inspection

__all__ = [
    "ARGS_ENV",
    "DEFAULT_STATE_SLOTS",
    "RESERVED_FLAGS",
    "BuiltArgs",
    "LaunchOptions",
    "build_args",
    "check_native_args",
    "last_value",
    "model_file",
    "parse_options",
    "reserved_state_slots",
    "state_blockers",
]

ARGS_ENV = "WERK_LLAMA_ARGS"
DEFAULT_STATE_SLOTS = 1
DEFAULT_STATE_HOLD_SECONDS = 900
DEFAULT_STATE_WAIT_SECONDS = 30
DEFAULT_PARALLEL = 4
DEFAULT_CTX = 4096
DEFAULT_STARTUP_TIMEOUT = 300.0
MAX_NATIVE_ARGS = 256

RESERVED_FLAGS: dict[str, str] = {
    "--host": "the listen address",
    "--port": "the port",
    "--reuse-port": "socket sharing",
    "--api-key": "the API key",
    "--api-key-file": "the API key",
    "--slot-save-path": "the slot save directory",
    "-m": "the model file",
    "--model": "the model file",
    "-mu": "the model file",
    "--model-url": "the model file",
    "-hf": "the model file",
    "-hfr": "the model file",
    "--hf-repo": "the model file",
    "-hff": "the model file",
    "--hf-file": "the model file",
    "-dr": "the model file",
    "--docker-repo": "the model file",
    "--api-prefix": "the API prefix",
    "--ssl-key-file": "TLS",
    "--ssl-cert-file": "TLS",
}
"""Native flags a user may not pass, with what they would take away from Werk."""

_KNOWN_OPTIONS = {
    "llama_server",
    "native_args",
    "warmup_tokens",
    "parallel",
    "ctx_size",
    "startup_timeout",
    "state_slots",
    "state_hold_seconds",
    "state_wait_seconds",
    "embeddings",
}


class LaunchOptions(msgspec.Struct, frozen=True):
    native_args: tuple[str, ...] = ()
    warmup_tokens: int = 0
    parallel: int = DEFAULT_PARALLEL
    ctx_size: int = DEFAULT_CTX
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    state_slots: int = DEFAULT_STATE_SLOTS
    state_hold_seconds: int = DEFAULT_STATE_HOLD_SECONDS
    state_wait_seconds: int = DEFAULT_STATE_WAIT_SECONDS
    embeddings: bool = False


def _int_option(options: Mapping[str, Any], key: str, default: int, lo: int, hi: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidRequest(f"llama.cpp model option {key!r} must be an integer in [{lo}, {hi}]")
    return value


def _bool_option(options: Mapping[str, Any], key: str) -> bool:
    value = options.get(key, False)
    if not isinstance(value, bool):
        raise InvalidRequest(f"llama.cpp model option {key!r} must be true or false")
    return value


def parse_options(
    options: Mapping[str, Any], environ: Mapping[str, str] | None = None
) -> LaunchOptions:
    """Validate the model's llama.cpp options and collect the native arguments.

    :raises werk.InvalidRequest: unknown keys, wrong types or out-of-range values.
    """
    unknown = sorted(set(options) - _KNOWN_OPTIONS)
    if unknown:
        raise InvalidRequest(
            f"unknown llama.cpp model option(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(_KNOWN_OPTIONS))}"
        )
    raw_native = options.get("native_args", [])
    if not isinstance(raw_native, list | tuple) or not all(isinstance(a, str) for a in raw_native):
        raise InvalidRequest("llama.cpp model option 'native_args' must be a list of strings")
    env = os.environ if environ is None else environ
    try:
        from_env = shlex.split(env.get(ARGS_ENV, ""))
    except ValueError as exc:
        raise InvalidRequest(f"{ARGS_ENV} is not valid shell syntax ({exc})") from None
    native = (*raw_native, *from_env)
    if len(native) > MAX_NATIVE_ARGS:
        raise InvalidRequest(f"at most {MAX_NATIVE_ARGS} native llama-server arguments")
    timeout = options.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT)
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (1 <= timeout <= 3600)
    ):
        raise InvalidRequest("llama.cpp model option 'startup_timeout' must be 1..3600 seconds")
    return LaunchOptions(
        native_args=native,
        warmup_tokens=_int_option(options, "warmup_tokens", 0, 0, 1 << 20),
        parallel=_int_option(options, "parallel", DEFAULT_PARALLEL, 1, 64),
        ctx_size=_int_option(options, "ctx_size", DEFAULT_CTX, 64, 1 << 20),
        startup_timeout=float(timeout),
        state_slots=_int_option(options, "state_slots", DEFAULT_STATE_SLOTS, 1, 16),
        state_hold_seconds=_int_option(
            options, "state_hold_seconds", DEFAULT_STATE_HOLD_SECONDS, 1, 900
        ),
        state_wait_seconds=_int_option(
            options, "state_wait_seconds", DEFAULT_STATE_WAIT_SECONDS, 0, 300
        ),
        embeddings=_bool_option(options, "embeddings"),
    )


def reserved_state_slots(options: LaunchOptions) -> int:
    """The slots kept for named states: none for an embeddings model (it keeps no named
    states; llama-server build 11434 also aborts on start in embeddings mode with some odd slot
    counts, 3 and 5 among them, on the demo model)."""
    return 0 if options.embeddings else options.state_slots


def _sets_pooling(native: Sequence[str]) -> bool:
    return any(canonical_flag(t).split("=", 1)[0] == "--pooling" for t in native)


def canonical_flag(token: str) -> str:
    """How llama.cpp's parser sees a token: ``--`` options have ``_`` read as ``-``."""
    if token.startswith("--"):
        return token.replace("_", "-")
    return token


def check_native_args(native: Sequence[str], inspection: Inspection) -> None:
    """Reject reserved, ``NAME=VALUE`` and unadvertised native flags (values pass)."""
    for token in native:
        if "\x00" in token:
            raise InvalidRequest("native llama-server arguments must not contain NUL bytes")
        if not token.startswith("-") or token[1:2].isdigit() or token in {"-", "--"}:
            continue  # a value (a path, a number, "-1")
        flag = canonical_flag(token)
        name = flag.split("=", 1)[0]
        if name in RESERVED_FLAGS:
            raise InvalidRequest(
                f"native llama-server argument {token.split('=', 1)[0]!r} is not allowed: "
                f"Werk sets {RESERVED_FLAGS[name]} of the processes it manages"
            )
        if "=" in flag:
            raise InvalidRequest(
                f"native llama-server argument {token!r}: llama-server does not accept "
                "NAME=VALUE; pass the name and the value as two arguments"
            )
        if inspection.flags and flag not in inspection.flags:
            raise InvalidRequest(
                f"native llama-server argument {token!r} is not an option this llama-server "
                "advertises in its --help"
            )


class BuiltArgs(msgspec.Struct, frozen=True):
    """One child's command line.

    :ivar argv: the exact arguments (after the executable) — contains the API key.
    :ivar public: ``argv`` with per-spawn values and secrets replaced by placeholders
        (``<model>``, ``<port>``, ``<api-key>``, ``<slot-dir>``); stable for one configuration,
        so it is the runtime key and ``Runtime.args`` (part of every state's envelope).
    :ivar n_parallel: the ``-np`` Werk asked for (before any native override).
    """

    argv: tuple[str, ...]
    public: tuple[str, ...]
    n_parallel: int

    def redacted(self) -> tuple[str, ...]:
        """``argv`` without the API key (what the plugin keeps on its handle)."""
        out = list(self.argv)
        for i, token in enumerate(out[:-1]):
            if token == "--api-key":  # noqa: S105 - the flag name, not a secret
                out[i + 1] = "<api-key>"
        return tuple(out)


def build_args(
    inspection: Inspection,
    *,
    model: Path,
    port: int,
    api_key: str,
    slot_dir: Path,
    alias: str,
    options: LaunchOptions,
) -> BuiltArgs:
    """Assemble the command line, using only flags ``inspection`` advertises.

    :raises werk.InvalidRequest: a native argument is reserved, malformed or not advertised.
    :raises werk.Unavailable: the executable lacks an essential flag.
    """
    if inspection.missing_essential:
        raise Unavailable(
            "this llama-server does not advertise "
            f"{', '.join(inspection.missing_essential)}; Werk cannot run it on a private "
            "loopback port",
            capability=CapabilityId.MODEL_RESIDENCY,
        )
    check_native_args(options.native_args, inspection)
    has = inspection.advertises
    head: list[tuple[str, ...]] = [
        ("-m" if has("-m") else "--model", "<model>"),
        ("--host", "127.0.0.1"),
        ("--port", "<port>"),
        ("--api-key", "<api-key>"),
    ]
    n_parallel = options.parallel + reserved_state_slots(options)
    if has("--slot-save-path"):
        head.append(("--slot-save-path", "<slot-dir>"))
    if has("-np", "--parallel"):
        head.append(("-np" if has("-np") else "--parallel", str(n_parallel)))
    else:
        n_parallel = 1
    if has("--cache-ram"):
        head.append(("--cache-ram", "0"))
    if options.warmup_tokens > 0 and has("--warmup"):
        head.append(("--warmup",))
    elif options.warmup_tokens == 0 and has("--no-warmup"):
        head.append(("--no-warmup",))
    if has("-c", "--ctx-size"):
        head.append(("-c" if has("-c") else "--ctx-size", str(options.ctx_size * n_parallel)))
    if options.embeddings and has("--embeddings"):
        head.append(("--embeddings",))
        if has("--pooling") and not _sets_pooling(options.native_args):
            head.append(("--pooling", "mean"))  # "none" (a causal model's own) is not OpenAI's
    if has("--alias"):
        head.append(("--alias", alias))
    if has("--no-ui"):
        head.append(("--no-ui",))
    elif has("--no-webui"):
        head.append(("--no-webui",))
    public = tuple(t for group in head for t in group) + tuple(options.native_args)
    real = {
        "<model>": str(model),
        "<port>": str(port),
        "<api-key>": api_key,
        "<slot-dir>": str(slot_dir),
    }
    head_len = sum(len(g) for g in head)
    argv = tuple(real.get(t, t) if i < head_len else t for i, t in enumerate(public))
    return BuiltArgs(argv=argv, public=public, n_parallel=n_parallel)


def model_file(spec: ModelSpec) -> Path:
    """The GGUF file llama-server is started on (the model's first file).

    :raises werk.InvalidRequest: the model has no files.
    """
    if not spec.files:
        raise InvalidRequest(f"model {spec.id!r} has no files")
    return spec.files[0]


def last_value(argv: Sequence[str], *spellings: str) -> str | None:
    """The value of the last of ``spellings`` in ``argv`` (llama.cpp's parser: the last wins)."""
    value = None
    for i, token in enumerate(argv[:-1]):
        if canonical_flag(token) in spellings:
            value = argv[i + 1]
    return value


def state_blockers(built: BuiltArgs, inspection: Inspection) -> list[str]:
    """Why this final argument set cannot host named states (empty when it can).

    The probe needs a private explicit slot and the private save directory, and reuse evidence
    must not come from llama-server's host-RAM prompt cache.
    """
    reasons = [f"inspection: {p}" for p in inspection.problems]
    if "--slot-save-path" not in built.argv:
        reasons.append("no private --slot-save-path")
    cache_ram = last_value(built.argv, "-cram", "--cache-ram")
    if inspection.advertises("--cache-ram") and cache_ram != "0":
        reasons.append("the native arguments re-enable the host-RAM prompt cache (--cache-ram)")
    return reasons
