"""The backend contract: every hook a Werk plugin may implement.

A plugin is a module (or object) registered through the ``werk`` entry-point group::

    [project.entry-points.werk]
    mybackend = "werk_mybackend.plugin"

and implements any of the hooks below with :data:`werk.hookimpl`. Hooks take keyword arguments;
an implementation may accept any subset of a hook's arguments (pluggy matches them by name).

**Registration and discovery** hooks (:func:`werk_register_backends`) are called on every
loaded plugin.

**Runtime** hooks (:func:`werk_capabilities` and the operation hooks) are called **only on the
plugin that registered the runtime's backend**, so an implementation never needs to check
"is this runtime mine?". Operation hooks may be ``async def``. They stop at the first
non-``None`` result. If the owning plugin has no implementation, the host raises
:class:`werk.Unsupported` naming the capability — an operation never silently does nothing.

Hook arguments may be added in later versions (implementations that do not name them keep
working); existing arguments are never renamed or removed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pluggy

from .protocol.capabilities import CapabilityReport

if TYPE_CHECKING:
    import typer

    from .backends import (
        BackendDescriptor,
        BackendState,
        CapabilityContext,
        DecodeCall,
        DecodeOutcome,
        ExpertMove,
        ExpertMoveOutcome,
        ExpertReport,
        OpenAICall,
        OpenAIReply,
        PrefillCall,
        PrefillOutcome,
        Runtime,
    )
    from .cache.entry import CacheEntry
    from .demos import DemoModel
    from .environments import EnvironmentSpec
    from .native_chat import NativeChatCache, NativeContext

PROJECT_NAME = "werk"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

__all__ = [
    "hookimpl",
    "hookspec",
    "werk_backend_environments",
    "werk_cache_inventory",
    "werk_cache_purge",
    "werk_capabilities",
    "werk_chat_native_cache",
    "werk_decode",
    "werk_demo_models",
    "werk_move_experts",
    "werk_observe_experts",
    "werk_openai",
    "werk_prefill",
    "werk_register_backends",
    "werk_register_commands",
    "werk_restore",
    "werk_snapshot",
]

# -------------------------------------------------------------------------------------------
# Registration
# -------------------------------------------------------------------------------------------


@hookspec
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    """Register the backends this plugin provides.

    Called once per plugin when the plugin manager loads it. A plugin that raises here is
    reported as a ``failed`` plugin row with the error text; the host keeps working.

    :param register: call it once per :class:`werk.BackendDescriptor`. Registering a backend
        name that another plugin already registered fails the second plugin.
    :returns: nothing.

    Example::

        @hookimpl
        def werk_register_backends(register):
            register(BackendDescriptor(name="echo", formats=("text",)))
    """


@hookspec
def werk_register_commands(app: typer.Typer, models: typer.Typer) -> None:
    """Add command-line commands.

    Called on every loaded plugin when the ``werk`` command starts. A plugin that raises here is
    reported on stderr and its commands are missing; the other commands keep working. Demo
    models and managed environments have their own hooks (:func:`werk_demo_models`,
    :func:`werk_backend_environments`): the host owns ``werk models create-demo`` and
    ``werk backends``.

    :param app: the root ``werk`` typer application (``app.command()`` adds ``werk NAME``).
    :param models: the ``werk models`` group (``models.command()`` adds ``werk models NAME``).
    :returns: nothing.

    Example::

        @hookimpl
        def werk_register_commands(app, models):
            @models.command("create-demo")
            def create_demo() -> None:
                ...
    """


@hookspec
def werk_demo_models() -> Sequence[DemoModel] | None:
    """Offer demo models this plugin can generate locally.

    Called on every loaded plugin by ``werk models create-demo``, in the ``werk`` process. The
    host picks the :class:`werk.DemoModel` whose ``kind`` the user asked for (``--kind``,
    default ``gguf``), calls its ``create`` and imports the files it returns for its
    ``backend``. Two plugins offering the same kind is an error naming both.

    :returns: the demo kinds, or ``None`` for none.

    Example::

        @hookimpl
        def werk_demo_models():
            return [DemoModel(kind="echo", backend="echo", description="a text file",
                              create=write_echo_model)]
    """


@hookspec
def werk_backend_environments() -> Sequence[EnvironmentSpec] | None:
    """Describe the managed Python environments this plugin's workers need.

    Called on every loaded plugin by ``werk backends list`` and ``werk backends install NAME``
    (in the ``werk`` process) and by anything that asks where an environment is. The host
    builds one with :class:`werk.ManagedEnvironment` under ``WERK_HOME/backends/<name>/venv``
    (never used half-built, recorded, replaced atomically); the plugin finds its interpreter
    with ``ManagedEnvironment(werk_home(), name).ready_python(spec)``.

    :returns: the environment specs (names unique across plugins), or ``None`` for none.

    Example::

        @hookimpl
        def werk_backend_environments():
            return [EnvironmentSpec(name="mybackend", requirements=("mylib==1.2",),
                                    imports=("mylib",))]
    """


# -------------------------------------------------------------------------------------------
# Discovery (called only on the owning plugin)
# -------------------------------------------------------------------------------------------


@hookspec
def werk_capabilities(context: CapabilityContext) -> Sequence[CapabilityReport] | None:
    """Report the capability rows of one backend, for one model or backend-wide.

    Called at request time, only on the plugin that owns ``context.backend``. Report only what is
    true now: ``experimental`` only after a functional probe passed for *this* process
    generation, ``unavailable`` (with a reason) when a prerequisite is missing, and omit ids the
    backend does not advertise at all. Core ids are those of :class:`werk.CapabilityId`;
    plugin-specific ids must be ``<backend>.<name>``.

    :param context: the backend, the model (``None`` for backend-wide rows) and the live
        runtime, if one exists.
    :returns: the rows (``backend`` and ``model`` may be left ``None``; the host fills them), or
        ``None`` to report nothing.
    """


# -------------------------------------------------------------------------------------------
# Operations (firstresult, called only on the owning plugin, may be async)
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def werk_prefill(
    runtime: Runtime, call: PrefillCall
) -> PrefillOutcome | Awaitable[PrefillOutcome] | None:
    """Evaluate a prompt prefix in the runtime and return its opaque state.

    Provides ``runtime.pd.prefill``. Stops at the first non-``None`` result.

    :param runtime: the owning plugin's live runtime for the request's model.
    :param call: prompt or messages, the effective policy, whether to keep a named state, and an
        optional compatible state to continue from.
    :returns: a :class:`werk.PrefillOutcome` whose ``state`` decode can continue from.
    :raises werk.WerkError: e.g. :class:`werk.BackendError` with Werk's own summary.
    """


@hookspec(firstresult=True)
def werk_decode(
    runtime: Runtime, call: DecodeCall
) -> DecodeOutcome | Awaitable[DecodeOutcome] | None:
    """Generate a continuation from a state produced by :func:`werk_prefill` or restore.

    Provides ``runtime.pd.decode``. The host has already consumed the handoff; a failure here is
    final for that handoff. Completion text over 1 MiB of UTF-8 is refused by the host.

    :param runtime: the owning plugin's live runtime.
    :param call: the state and the sampling parameters; ``call.restore``, when present, returns
        the state's disk copy (call it at most once, when the live state is gone).
    :returns: a :class:`werk.DecodeOutcome`, optionally with a replacement state.
    """


@hookspec(firstresult=True)
def werk_snapshot(
    runtime: Runtime, state: BackendState
) -> BackendState | Awaitable[BackendState] | None:
    """Export a live state as a disk-persistable opaque payload (bytes or a file).

    Provides ``runtime.state.persistence``. The host streams the payload into its catalog,
    hashing it on the way; it never interprets the bytes.

    :param runtime: the owning plugin's live runtime.
    :param state: the live state to export.
    :returns: a :class:`werk.BackendState` of kind ``bytes`` or ``file``.
    """


@hookspec(firstresult=True)
def werk_restore(
    runtime: Runtime, payload: BackendState
) -> BackendState | Awaitable[BackendState] | None:
    """Load a persisted payload back into the runtime.

    Provides ``runtime.state.restore``. The host calls it only when the payload's compatibility
    envelope equals the runtime's exactly. A failed restore must leave no partial state behind
    that could serve another request.

    :param runtime: the owning plugin's live runtime.
    :param payload: a ``file`` or ``bytes`` state from the catalog (hash already verified).
    :returns: the live state decode can continue from.
    """


@hookspec(firstresult=True)
def werk_move_experts(
    runtime: Runtime, move: ExpertMove
) -> ExpertMoveOutcome | Awaitable[ExpertMoveOutcome] | None:
    """Move MoE experts between residency tiers.

    Provides ``runtime.experts.residency``. The host's expert policy engine plans and claims the
    move; this hook performs it and reports exactly which experts moved. Metadata changes only
    for those.

    :param runtime: the owning plugin's live runtime.
    :param move: expert ids and the target tier (``vram``, ``ram`` or ``external``).
    :returns: a :class:`werk.ExpertMoveOutcome`.
    """


@hookspec(firstresult=True)
def werk_observe_experts(runtime: Runtime) -> ExpertReport | Awaitable[ExpertReport] | None:
    """Report the MoE experts the runtime holds, their tiers and sizes, and recent accesses.

    Provides the observation half of ``runtime.experts.residency``. The host's expert policy
    engine keeps hotness scores, pins and cooldowns from these reports; it never discovers
    experts itself. Report only what the backend truly observes: unknown sizes are ``None``.

    :param runtime: the owning plugin's live runtime.
    :returns: a :class:`werk.ExpertReport`.
    """


@hookspec(firstresult=True)
def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply | Awaitable[OpenAIReply] | None:
    """Answer an OpenAI-compatible ``/v1`` chat or text completion request.

    Not a protocol capability: a backend without it cannot serve ``/v1`` inference and the host
    answers ``unsupported``. Streaming replies are passed to the client as they arrive, never
    buffered whole. Backend error bodies must be turned into :class:`werk.WerkError` subclasses
    with Werk's own message; they are never forwarded.

    :param runtime: the owning plugin's live runtime for the requested model.
    :param call: route, the client's JSON body and whether it asked to stream.
    :returns: a :class:`werk.OpenAIReply` with a ``body`` or a ``stream`` of SSE payloads.
    """


# -------------------------------------------------------------------------------------------
# Local disk caches (`werk cache`)
# -------------------------------------------------------------------------------------------


@hookspec
def werk_cache_inventory(home: Path) -> Sequence[CacheEntry] | None:
    """List the on-disk caches this plugin owns under ``WERK_HOME`` (e.g. worker caches).

    Called on every loaded plugin by ``werk cache list`` and ``werk cache purge``, in the
    ``werk`` process itself (no server, no runtime). Must be read-only and quick: create,
    repair or delete nothing, never start a process, and never report model weights (the
    host never removes those). Report an entry ``active`` when a live process uses it now and
    ``pinned`` when the operator asked to keep it; both are then skipped by every purge. A
    plugin that raises (or returns something other than :class:`werk.CacheEntry` objects) is
    reported on stderr and its entries are missing from the listing.

    :param home: the active ``WERK_HOME``.
    :returns: the entries (ids unique within this plugin), or ``None`` for none.

    Example::

        @hookimpl
        def werk_cache_inventory(home):
            root = home / "backends" / "mybackend" / "workers"
            return [CacheEntry(id=p.name, path=p) for p in sorted(root.glob("w_*"))]
    """


@hookspec(firstresult=True)
def werk_cache_purge(home: Path, entry_id: str) -> bool | None:
    """Delete one cache entry this plugin reported through :func:`werk_cache_inventory`.

    Called only on the plugin that reported ``entry_id``, only by ``werk cache purge
    --execute``, and only after the host listed the entry again and found it neither
    ``active`` nor ``pinned``. The state can change in between: take your own lock, check
    again, and raise :class:`werk.Conflict` when a live process uses the entry now (the host
    reports it as skipped). Delete only what the entry covers, without following symbolic links.

    :param home: the active ``WERK_HOME``.
    :param entry_id: the plugin-local id (without the ``worker:<plugin>/`` prefix).
    :returns: ``True`` when it was deleted, ``False`` when it no longer existed, ``None`` to
        decline (the host reports an error for that entry).
    """


# -------------------------------------------------------------------------------------------
# Terminal chat (`werk run` / `werk chat` on the local route)
# -------------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def werk_chat_native_cache(
    runtime: Runtime, context: NativeContext
) -> NativeChatCache | Awaitable[NativeChatCache | None] | None:
    """Offer a backend-native KV snapshot provider for one persistent terminal chat session.

    Called **only on the plugin that owns** ``runtime.backend``, once per local runtime that
    ``werk run``/``werk chat --persistence`` started in its own process (again if that runtime
    died and was replaced), after the runtime is ready and before the first request. Never
    called without ``--persistence``, nor on the ``--server`` route. Stops at the first
    non-``None`` result; may be ``async``.

    The provider (a :class:`werk.NativeChatCache`) is then told about every real request and
    turn: ``before_request(body)`` returns the body to send (it may pin a slot) and is where an
    existing snapshot is verified and restored lazily on the *first* real request;
    ``after_response(outcome)`` saves a snapshot only for a :class:`werk.TurnOutcome` with
    ``complete`` true; ``close()`` runs once before the runtime stops. Rules (the seed's
    "Local llama.cpp startup and lazy restore validation"): never run a synthetic prompt;
    check compatibility (model files, runtime binary and libraries, environment, effective
    arguments, receipt schema) and file integrity before any restore; only a positive,
    consistent backend-reported cached-token count on the first request after a restore is
    evidence of restored reuse; a restore failure must clear what it loaded and let the
    conversation go on from the archive. Keep every file in ``context.native_dir(create)``
    (owner-only, no-follow); ``werk cache`` lists and purges that directory.

    :param runtime: the owning plugin's live runtime (started by this process).
    :param context: a :class:`werk.NativeContext`: the same runtime, ``native_dir`` (the
        session's private directory for your files) and ``phase`` for ``-v`` diagnostics
        (runtime inspection, native readiness, preparation, restore...).
    :returns: a :class:`werk.NativeChatCache`, or ``None`` when native snapshots do not apply to
        this runtime (the session is then "conversation archive only"). Raising is reported as
        a ``-v`` phase and treated like ``None``; the chat goes on.
    """
