"""The two engines in-process: the local runtime path (with the native snapshot seam) and the
``--server`` transport rules.

The local engine is driven with an in-memory plugin registered through
``get_plugin_manager(plugins=...)``, so start/stop, ``werk_openai`` and the provider calls can
be recorded; the remote engine with ``httpx.MockTransport``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import werk
from werk import WerkPluginManager
from werk.chat.archive import SessionStore
from werk.chat.local import LocalEngine
from werk.chat.native import NativeContext, TurnOutcome
from werk.chat.remote import RemoteEngine
from werk.chat.session import Conversation, Sampling, run_turn
from werk.models import ModelRegistry
from werk.protocol import BackendError, InvalidRequest, Unauthenticated, Unavailable


class FakePlugin:
    """Backend ``fake``: records start/stop, streams ``reply`` word by word."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.bodies: list[dict[str, Any]] = []
        self.hang = False
        self.explode = False
        self.generation = 0

    @werk.hookimpl
    def werk_register_backends(self, register: Callable[[werk.BackendDescriptor], None]) -> None:
        register(werk.BackendDescriptor(name="fake", start=self.start, stop=self.stop))

    async def start(self, spec: werk.ModelSpec) -> werk.Runtime:
        self.generation += 1
        self.events.append(f"start g{self.generation}")
        return werk.Runtime(backend="fake", model=spec, generation=f"g{self.generation}")

    async def stop(self, runtime: werk.Runtime) -> None:
        self.events.append(f"stop {runtime.generation}")
        runtime.alive = False

    @werk.hookimpl
    async def werk_openai(self, runtime: werk.Runtime, call: werk.OpenAICall) -> werk.OpenAIReply:
        self.bodies.append(call.body)
        plugin = self

        async def chunks() -> AsyncIterator[bytes]:
            try:
                for word in ("one", " two"):
                    delta = {"content": word}
                    yield json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()
                    if plugin.hang:
                        await anyio.sleep_forever()
                    if plugin.explode:
                        raise RuntimeError("secret backend detail")
                finish = {"index": 0, "delta": {}, "finish_reason": "stop"}
                usage = {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}}
                yield json.dumps({"choices": [finish], "usage": usage}).encode()
            finally:
                plugin.events.append("stream closed")

        return werk.OpenAIReply(stream=chunks())


class Recorder:
    """A native snapshot provider that records what the engine tells it."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.outcomes: list[TurnOutcome] = []

    async def before_request(self, body: dict[str, Any]) -> dict[str, Any]:
        self.events.append("before_request")
        return {**body, "x_native": True}

    async def after_response(self, outcome: TurnOutcome) -> None:
        self.events.append(f"after_response complete={outcome.complete}")
        self.outcomes.append(outcome)

    async def close(self) -> None:
        self.events.append("native close")


@pytest.fixture
def fake(tmp_path: Path) -> tuple[FakePlugin, Path]:
    plugin = FakePlugin()
    home = tmp_path / "home"
    model = tmp_path / "m.bin"
    model.write_bytes(b"weights")
    ModelRegistry(home).import_files([model], model_id="m", backend="fake")
    return plugin, home


def engine_for(plugin: FakePlugin, home: Path, **kw: Any) -> LocalEngine:
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("fake", plugin)], environ={})
    return LocalEngine(home, "m", phase=lambda _: None, pm=pm, **kw)


def interrupt(piece: str) -> None:
    """Stands for Ctrl+C: SIGINT raises KeyboardInterrupt in the main thread mid-reply."""
    raise KeyboardInterrupt


def turn(engine: LocalEngine, conv: Conversation, text: str, on_text: Any = None) -> Any:
    return run_turn(
        engine,
        conv,
        text,
        sampling=Sampling(temperature=0.5, seed=7, max_tokens=9),
        on_text=on_text or (lambda _: None),
        phase=lambda _: None,
    )


def test_turns_reach_werk_openai_and_close_stops_the_runtime(fake: Any) -> None:
    plugin, home = fake
    conv = Conversation("m", system="sys")
    with engine_for(plugin, home) as engine:
        assert turn(engine, conv, "hi").text == "one two"
        assert turn(engine, conv, "again").finish_reason == "stop"
        runtime = engine.runtime
    assert plugin.events == ["start g1", "stream closed", "stream closed", "stop g1"]
    assert runtime is not None and not runtime.alive
    body = plugin.bodies[1]
    assert body["stream"] is True and body["model"] == "m"
    assert (body["temperature"], body["seed"], body["max_tokens"]) == (0.5, 7, 9)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]


def test_cancelling_a_reply_closes_the_backend_stream(fake: Any) -> None:
    plugin, home = fake
    plugin.hang = True
    conv = Conversation("m")

    with engine_for(plugin, home) as engine:
        with pytest.raises(KeyboardInterrupt):
            turn(engine, conv, "hi", on_text=interrupt)
        assert plugin.events == ["start g1", "stream closed"]
        assert conv.messages == []  # the cancelled turn is not kept
        plugin.hang = False
        assert turn(engine, conv, "hi").text == "one two"
    assert plugin.events[-1] == "stop g1"


def test_backend_failures_mid_stream_are_contained(fake: Any) -> None:
    plugin, home = fake
    plugin.explode = True
    with engine_for(plugin, home) as engine, pytest.raises(BackendError) as info:
        turn(engine, Conversation("m"), "hi")
    assert "secret" not in info.value.message


def test_a_dead_runtime_is_replaced_before_the_next_turn(fake: Any) -> None:
    plugin, home = fake
    with engine_for(plugin, home) as engine:
        conv = Conversation("m")
        turn(engine, conv, "hi")
        assert engine.runtime is not None
        engine.runtime.alive = False
        turn(engine, conv, "again")
    starts_stops = [e for e in plugin.events if e != "stream closed"]
    assert starts_stops == ["start g1", "stop g1", "start g2", "stop g2"]


def test_native_provider_seam(fake: Any, tmp_path: Path) -> None:
    plugin, home = fake
    recorders: list[Recorder] = []
    contexts: list[NativeContext] = []

    async def provider(pm: WerkPluginManager, context: NativeContext) -> Recorder:
        contexts.append(context)
        recorders.append(Recorder(plugin.events))
        return recorders[-1]

    store = SessionStore(home)
    with (
        store.open("s", model="m") as archive,
        engine_for(plugin, home, archive=archive, providers=[provider]) as engine,
    ):
        conv = Conversation("m", archive=archive)
        turn(engine, conv, "hi")
        # The provider's private place is the session's native/ dir (not created by asking).
        native_dir = contexts[0].native_dir
        assert native_dir(False) is None
        assert native_dir(True) == archive.native_dir(create=False) is not None
        plugin.hang = True
        with pytest.raises(KeyboardInterrupt):
            turn(engine, conv, "more", on_text=interrupt)
    (ctx,) = contexts
    assert ctx.runtime.generation == "g1"
    assert plugin.bodies[0]["x_native"] is True
    done, cancelled = recorders[0].outcomes
    assert done.complete and done.reply == "one two" and done.usage is not None
    assert done.messages[-1] == {"role": "user", "content": "hi"}
    assert not cancelled.complete and cancelled.reply == "one"
    assert plugin.events[-3:] == ["after_response complete=False", "native close", "stop g1"]
    assert store.read("s").messages == conv.messages and len(conv.messages) == 2


def test_without_persistence_no_provider_is_consulted(fake: Any) -> None:
    plugin, home = fake
    called: list[object] = []

    async def provider(context: NativeContext) -> None:
        called.append(context)

    with engine_for(plugin, home, providers=[provider]) as engine:
        turn(engine, Conversation("m"), "hi")
    assert called == []


def test_a_model_without_a_startable_backend_fails_cleanly(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (tmp_path / "m.bin").write_bytes(b"w")
    ModelRegistry(home).import_files([tmp_path / "m.bin"], model_id="m", backend="absent")
    pm = werk.get_plugin_manager(load_entrypoints=False, environ={})
    with pytest.raises(Unavailable, match="no loaded plugin provides backend 'absent'"):
        LocalEngine(home, "m", phase=lambda _: None, pm=pm).__enter__()


# -- the --server transport ----------------------------------------------------------------


def remote(handler: Callable[[httpx.Request], httpx.Response]) -> RemoteEngine:
    return RemoteEngine("http://127.0.0.1:9", api_key="k", transport=httpx.MockTransport(handler))


def body_of(engine: RemoteEngine) -> list[dict[str, Any]]:
    return list(engine.stream({"model": "m", "messages": [], "stream": True}))


def test_remote_streams_and_authenticates() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        events = b'data: {"choices":[]}\n\ndata: [DONE]\n\ndata: {"ignored":1}\n\n'
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events)

    assert body_of(remote(handler)) == [{"choices": []}]
    assert seen[0].headers["authorization"] == "Bearer k"
    assert seen[0].url.path == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("response", "error"),
    [
        (httpx.Response(307, headers={"location": "http://evil/"}), InvalidRequest),
        (
            httpx.Response(401, json={"error": {"code": "unauthenticated", "message": "no"}}),
            Unauthenticated,
        ),
        (httpx.Response(500, content=b"<html>"), Unavailable),
        (httpx.Response(200, headers={"content-type": "text/html"}, content=b"x"), Unavailable),
        (
            httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=b"data: {}\n\n"
            ),
            Unavailable,  # no [DONE]: the stream was cut short
        ),
    ],
)
def test_remote_refuses_what_it_cannot_trust(response: httpx.Response, error: type) -> None:
    with pytest.raises(error):
        body_of(remote(lambda _: response))


@pytest.mark.parametrize("url", ["https://h:1", "http://h:1/v1", "http://u@h:1", "ftp://h", "h:1"])
def test_remote_urls_are_plain_http_roots(url: str) -> None:
    with pytest.raises(InvalidRequest):
        RemoteEngine(url)
