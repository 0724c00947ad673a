"""Owner-only dispatch: an operation reaches only the plugin that owns the runtime's backend."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import typer

import werk
from werk import (
    OPERATION_CAPABILITY,
    BackendDescriptor,
    BackendState,
    DecodeCall,
    DecodeOutcome,
    ExpertMove,
    ExpertMoveOutcome,
    ExpertObservation,
    ExpertReport,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Operation,
    PrefillCall,
    PrefillOutcome,
    Runtime,
    StateKind,
    hookimpl,
)
from werk.protocol import ExpertTier, FinishReason

MakePM = Callable[..., werk.WerkPluginManager]

pytestmark = pytest.mark.anyio


def _state(tag: str) -> BackendState:
    return BackendState(kind=StateKind.BYTES, generation="g1", data=tag.encode())


def _runtime(backend: str) -> Runtime:
    model = ModelSpec(id="demo", backend=backend, identity="sha256:" + "0" * 64)
    return Runtime(backend=backend, model=model, generation="g1")


ARGUMENTS: dict[Operation, dict[str, Any]] = {
    Operation.PREFILL: {"call": PrefillCall(prompt="hello")},
    Operation.DECODE: {"call": DecodeCall(state=_state("prefix"))},
    Operation.SNAPSHOT: {"state": _state("live")},
    Operation.RESTORE: {"payload": _state("disk")},
    Operation.MOVE_EXPERTS: {"move": ExpertMove(expert_ids=["e0"], target="ram")},
    Operation.OBSERVE_EXPERTS: {},
    Operation.OPENAI: {"call": OpenAICall(route="completions", body={"prompt": "hi"})},
}
"""Keyword arguments of every operation hook, keyed by operation."""


class Registers:
    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name=self.backend))


class EveryOperation(Registers):
    """Implements every operation hook and records each call."""

    @hookimpl
    def werk_prefill(self, runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
        self.calls.append(("werk_prefill", {"runtime": runtime, "call": call}))
        return PrefillOutcome(state=_state(self.backend), prompt_tokens=len(self.backend))

    @hookimpl
    def werk_decode(self, runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
        self.calls.append(("werk_decode", {"runtime": runtime, "call": call}))
        return DecodeOutcome(
            text=self.backend, finish_reason=FinishReason.STOP, completion_tokens=1
        )

    @hookimpl
    def werk_snapshot(self, runtime: Runtime, state: BackendState) -> BackendState:
        self.calls.append(("werk_snapshot", {"runtime": runtime, "state": state}))
        return _state(self.backend)

    @hookimpl
    def werk_restore(self, runtime: Runtime, payload: BackendState) -> BackendState:
        self.calls.append(("werk_restore", {"runtime": runtime, "payload": payload}))
        return _state(self.backend)

    @hookimpl
    def werk_move_experts(self, runtime: Runtime, move: ExpertMove) -> ExpertMoveOutcome:
        self.calls.append(("werk_move_experts", {"runtime": runtime, "move": move}))
        return ExpertMoveOutcome(moved=[self.backend])

    @hookimpl
    def werk_observe_experts(self, runtime: Runtime) -> ExpertReport:
        self.calls.append(("werk_observe_experts", {"runtime": runtime}))
        return ExpertReport(experts=[ExpertObservation(id=self.backend, tier=ExpertTier.RAM)])

    @hookimpl
    def werk_openai(self, runtime: Runtime, call: OpenAICall) -> OpenAIReply:
        self.calls.append(("werk_openai", {"runtime": runtime, "call": call}))
        return OpenAIReply(body={"backend": self.backend})


@pytest.mark.parametrize("operation", list(Operation), ids=[o.value for o in Operation])
async def test_only_the_owner_is_called(operation: Operation, make_pm: MakePM) -> None:
    alpha, beta = EveryOperation("alpha"), EveryOperation("beta")
    # beta is registered last, so an undirected firstresult call would reach beta first.
    pm = make_pm(("alpha-plugin", alpha), ("beta-plugin", beta))
    runtime = _runtime("alpha")
    result = await pm.call_operation(operation, runtime, **ARGUMENTS[operation])
    assert beta.calls == []
    assert alpha.calls == [(operation.value, {"runtime": runtime, **ARGUMENTS[operation]})]
    assert "alpha" in repr(result) and "beta" not in repr(result)


async def test_a_plugin_registered_after_a_call_is_still_left_out(make_pm: MakePM) -> None:
    """The owner-only caller is built once per plugin and hook; a later registration (or
    unregistration) rebuilds it, so a newcomer implementing the same hook is not called."""
    alpha = EveryOperation("alpha")
    pm = make_pm(("alpha-plugin", alpha))
    call = ARGUMENTS[Operation.OPENAI]
    runtime = _runtime("alpha")
    await pm.call_operation(Operation.OPENAI, runtime, **call)
    gamma = EveryOperation("gamma")
    pm.register(gamma, name="gamma-plugin")  # registered last: an undirected call reaches it
    result = await pm.call_operation(Operation.OPENAI, runtime, **call)
    assert gamma.calls == [] and result.body == {"backend": "alpha"}
    assert len(alpha.calls) == 2
    pm.unregister(gamma)
    await pm.call_operation(Operation.OPENAI, runtime, **call)
    assert len(alpha.calls) == 3 and gamma.calls == []


class Wrapped(EveryOperation):
    """Also wraps its own ``werk_openai`` (a pluggy wrapper under another attribute name)."""

    def __init__(self, backend: str) -> None:
        super().__init__(backend)
        self.wrapped: list[str] = []

    @hookimpl(specname="werk_openai", wrapper=True)
    def wrap_openai(self, call: OpenAICall) -> Any:
        self.wrapped.append("before")
        result = yield
        self.wrapped.append("after")
        return result


async def test_a_wrapper_of_the_owner_still_runs(make_pm: MakePM) -> None:
    """The owner-only caller bypasses pluggy only for one plain implementation; an owner that
    also wraps the hook is called through pluggy, which runs the wrapper around it."""
    owner = Wrapped("alpha")
    pm = make_pm(("alpha-plugin", owner))
    call = ARGUMENTS[Operation.OPENAI]
    result = await pm.call_operation(Operation.OPENAI, _runtime("alpha"), **call)
    assert result.body == {"backend": "alpha"}
    assert owner.wrapped == ["before", "after"]
    assert [name for name, _ in owner.calls] == ["werk_openai"]


class OnlyTheCall(Registers):
    """Declares fewer arguments than the hook offers: pluggy passes only those."""

    @hookimpl
    def werk_openai(self, call: OpenAICall) -> OpenAIReply:
        self.calls.append(("werk_openai", {"call": call}))
        return OpenAIReply(body={"prompt": call.body["prompt"]})


async def test_an_implementation_gets_only_the_arguments_it_declares(make_pm: MakePM) -> None:
    plugin = OnlyTheCall("alpha")
    pm = make_pm(("alpha-plugin", plugin))
    call = ARGUMENTS[Operation.OPENAI]
    result = await pm.call_operation(Operation.OPENAI, _runtime("alpha"), **call)
    assert result.body == {"prompt": "hi"}
    assert plugin.calls == [("werk_openai", call)]


async def test_hook_call_monitoring_sees_operations_called_before_it_was_added(
    make_pm: MakePM,
) -> None:
    """A monitor added after an operation's caller was built (``WERK_TRACE_PLUGINS`` adds one
    at start-up; a test or an embedding application may add one later) still sees the call."""
    alpha = EveryOperation("alpha")
    pm = make_pm(("alpha-plugin", alpha))
    runtime = _runtime("alpha")
    await pm.call_operation(Operation.OPENAI, runtime, **ARGUMENTS[Operation.OPENAI])
    seen: list[str] = []
    pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append(name), lambda *a: None)
    result = await pm.call_operation(Operation.OPENAI, runtime, **ARGUMENTS[Operation.OPENAI])
    assert seen == ["werk_openai"] and result.body == {"backend": "alpha"}
    assert len(alpha.calls) == 2


async def test_prefill_goes_to_whichever_plugin_owns_the_runtime(make_pm: MakePM) -> None:
    alpha, beta = EveryOperation("alpha"), EveryOperation("beta")
    pm = make_pm(("alpha-plugin", alpha), ("beta-plugin", beta))
    outcome = await pm.call_operation(Operation.PREFILL, _runtime("beta"), call=PrefillCall())
    assert outcome.state.data == b"beta"
    assert [name for name, _ in beta.calls] == ["werk_prefill"]
    assert alpha.calls == []


def test_every_protocol_operation_maps_to_a_capability() -> None:
    # werk_openai is plain /v1 inference, not a protocol capability.
    assert set(OPERATION_CAPABILITY) == set(Operation) - {Operation.OPENAI}
    assert {op.value: cap.value for op, cap in OPERATION_CAPABILITY.items()} == {
        "werk_prefill": "runtime.pd.prefill",
        "werk_decode": "runtime.pd.decode",
        "werk_snapshot": "runtime.state.persistence",
        "werk_restore": "runtime.state.restore",
        "werk_move_experts": "runtime.experts.residency",
        "werk_observe_experts": "runtime.experts.residency",
    }


@pytest.mark.parametrize(
    ("operation", "capability"),
    list(OPERATION_CAPABILITY.items()),
    ids=[o.value for o in OPERATION_CAPABILITY],
)
async def test_missing_implementation_is_unsupported(
    operation: Operation, capability: werk.CapabilityId, make_pm: MakePM
) -> None:
    bystander = EveryOperation("other")
    pm = make_pm(("bare", Registers("bare")), ("bystander", bystander))
    with pytest.raises(werk.Unsupported) as info:
        await pm.call_operation(operation, _runtime("bare"), **ARGUMENTS[operation])
    assert info.value.capability == capability.value
    assert info.value.code is werk.ErrorCode.UNSUPPORTED
    assert bystander.calls == []  # no silent fall-through to another plugin


async def test_missing_openai_implementation_is_unsupported(make_pm: MakePM) -> None:
    bystander = EveryOperation("other")
    pm = make_pm(("bare", Registers("bare")), ("bystander", bystander))
    with pytest.raises(werk.Unsupported, match="werk_openai") as info:
        await pm.call_operation(Operation.OPENAI, _runtime("bare"), **ARGUMENTS[Operation.OPENAI])
    assert info.value.capability is None
    assert bystander.calls == []


async def test_async_implementation_is_awaited(make_pm: MakePM) -> None:
    class AsyncPrefill(Registers):
        @hookimpl
        async def werk_prefill(self, runtime: Runtime, call: PrefillCall) -> PrefillOutcome:
            return PrefillOutcome(state=_state("async"), prompt_tokens=3, cached_tokens=1)

    pm = make_pm(("async", AsyncPrefill("asyncbackend")))
    outcome = await pm.call_operation(
        Operation.PREFILL, _runtime("asyncbackend"), call=PrefillCall()
    )
    assert isinstance(outcome, PrefillOutcome)
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (3, 1)


async def test_async_implementation_may_decline(make_pm: MakePM) -> None:
    class AsyncDecline(Registers):
        @hookimpl
        async def werk_decode(self, runtime: Runtime, call: DecodeCall) -> None:
            return None

    pm = make_pm(("decline", AsyncDecline("declines")))
    with pytest.raises(werk.Unsupported) as info:
        await pm.call_operation(
            Operation.DECODE, _runtime("declines"), **ARGUMENTS[Operation.DECODE]
        )
    assert info.value.capability == "runtime.pd.decode"


async def test_implementation_returning_none_is_unsupported(make_pm: MakePM) -> None:
    class Declines(Registers):
        @hookimpl
        def werk_snapshot(self, runtime: Runtime, state: BackendState) -> None:
            self.calls.append(("werk_snapshot", {}))
            return None

    plugin = Declines("declines")
    pm = make_pm(("declines", plugin))
    with pytest.raises(werk.Unsupported, match="declined") as info:
        await pm.call_operation(Operation.SNAPSHOT, _runtime("declines"), state=_state("x"))
    assert info.value.capability == "runtime.state.persistence"
    assert len(plugin.calls) == 1


async def test_foreign_exception_becomes_backend_error(
    make_pm: MakePM, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "upstream said: {'detail': 'token sk-live-1234 leaked'}"

    class Crashes(Registers):
        @hookimpl
        def werk_restore(self, runtime: Runtime, payload: BackendState) -> BackendState:
            raise RuntimeError(secret)

    pm = make_pm(("crashes", Crashes("crashy")))
    with (
        caplog.at_level(logging.ERROR, logger="werk.plugins"),
        pytest.raises(werk.BackendError) as info,
    ):
        await pm.call_operation(Operation.RESTORE, _runtime("crashy"), payload=_state("p"))
    err = info.value
    assert "sk-live-1234" not in err.message and "sk-live-1234" not in str(err)
    assert "upstream said" not in repr(err)
    assert err.__cause__ is None and err.__suppress_context__
    assert "sk-live-1234" not in werk.protocol.encode(err.to_body("req_1")).decode()
    assert err.message == "backend 'crashy' failed during restore"
    # The full exception is for the operator's log, not for the client.
    logged = [r for r in caplog.records if r.name == "werk.plugins" and r.exc_info]
    assert logged and isinstance(logged[0].exc_info[1], RuntimeError)  # type: ignore[index]


@pytest.mark.parametrize(
    "error",
    [
        werk.Conflict("slot busy"),
        werk.ResourceExhausted("no room", retryable=False),
        werk.BackendError("llama-server exited"),
        werk.Unsupported("not for this model", capability="runtime.pd.prefill"),
    ],
    ids=lambda e: type(e).__name__,
)
async def test_werk_error_propagates_unchanged(error: werk.WerkError, make_pm: MakePM) -> None:
    class Refuses(Registers):
        @hookimpl
        def werk_move_experts(self, runtime: Runtime, move: ExpertMove) -> ExpertMoveOutcome:
            raise error

    pm = make_pm(("refuses", Refuses("refuses")))
    with pytest.raises(werk.WerkError) as info:
        await pm.call_operation(
            Operation.MOVE_EXPERTS, _runtime("refuses"), **ARGUMENTS[Operation.MOVE_EXPERTS]
        )
    assert info.value is error


async def test_async_werk_error_propagates_unchanged(make_pm: MakePM) -> None:
    error = werk.WerkTimeout("no answer in 30 s")

    class SlowFail(Registers):
        @hookimpl
        async def werk_decode(self, runtime: Runtime, call: DecodeCall) -> DecodeOutcome:
            raise error

    pm = make_pm(("slow", SlowFail("slow")))
    with pytest.raises(werk.WerkTimeout) as info:
        await pm.call_operation(Operation.DECODE, _runtime("slow"), **ARGUMENTS[Operation.DECODE])
    assert info.value is error


async def test_runtime_of_unknown_backend_is_unsupported(make_pm: MakePM) -> None:
    bystander = EveryOperation("known")
    pm = make_pm(("known", bystander))
    with pytest.raises(werk.Unsupported, match="ghost"):
        await pm.call_operation(Operation.PREFILL, _runtime("ghost"), call=PrefillCall())
    assert bystander.calls == []


async def test_failed_plugin_receives_no_operations(make_pm: MakePM) -> None:
    """A plugin that failed registration is unregistered: its hooks are unreachable."""

    class DuplicateWithOps(EveryOperation):
        pass

    first, duplicate = EveryOperation("dup"), DuplicateWithOps("dup")
    pm = make_pm(("first", first), ("duplicate", duplicate))
    await pm.call_operation(Operation.PREFILL, _runtime("dup"), call=PrefillCall())
    assert [name for name, _ in first.calls] == ["werk_prefill"]
    assert duplicate.calls == []


class _Commands:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="cmds"))

    @hookimpl
    def werk_register_commands(self, app: typer.Typer, models: typer.Typer) -> None:
        @models.command("count-cmds")
        def count() -> None:
            typer.echo("0 cmds models")


def test_register_commands_goes_through_the_plugin_manager(make_pm: MakePM) -> None:
    from typer.testing import CliRunner

    from werk.cli.plugin_commands import register_plugin_commands

    root, models = typer.Typer(), typer.Typer()
    root.add_typer(models, name="models")

    @root.command()
    def version() -> None:  # a second command, so typer keeps sub-command names
        typer.echo("v")

    register_plugin_commands(make_pm(("werk-cmds", _Commands())), root=root, models=models)
    result = CliRunner().invoke(root, ["models", "count-cmds"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "0 cmds models"


class _Offers:
    """A plugin offering one environment and one demo kind."""

    def __init__(self, backend: str, env_name: str, kind: str) -> None:
        self.backend, self.env_name, self.kind = backend, env_name, kind

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name=self.backend))

    @hookimpl
    def werk_backend_environments(self) -> list[werk.EnvironmentSpec]:
        return [werk.EnvironmentSpec(name=self.env_name, requirements=("tinypkg==1.0",))]

    @hookimpl
    def werk_demo_models(self) -> list[werk.DemoModel]:
        return [werk.DemoModel(kind=self.kind, backend=self.backend, description="d", create=list)]


def test_environments_and_demo_kinds_are_collected_through_the_plugin_manager(
    make_pm: MakePM,
) -> None:
    from werk.cli.backends import environment_specs
    from werk.cli.models import demo_models

    pm = make_pm(
        ("werk-a", _Offers("a", "env-a", "kind-a")), ("werk-b", _Offers("b", "env-b", "kind-b"))
    )
    specs = environment_specs(pm)
    assert {name: plugin for name, (plugin, _) in specs.items()} == {
        "env-a": "werk-a",
        "env-b": "werk-b",
    }
    kinds = demo_models(pm)
    assert {kind: (plugin, d.backend) for kind, (plugin, d) in kinds.items()} == {
        "kind-a": ("werk-a", "a"),
        "kind-b": ("werk-b", "b"),
    }


def test_two_plugins_offering_the_same_environment_or_kind_is_an_error(make_pm: MakePM) -> None:
    from werk.cli.backends import environment_specs
    from werk.cli.models import demo_models

    pm = make_pm(("werk-a", _Offers("a", "same", "same")), ("werk-b", _Offers("b", "same", "same")))
    with pytest.raises(werk.InvalidRequest, match="'same' is offered by werk-a and werk-b"):
        environment_specs(pm)
    with pytest.raises(werk.InvalidRequest, match="'same' is offered by werk-a and werk-b"):
        demo_models(pm)
