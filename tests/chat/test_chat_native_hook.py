"""``werk_chat_native_cache``: the hook behind :func:`werk.chat.native.native_providers`.

The factory the local engine consults asks only the plugin that owns the runtime's backend; a
plugin without the hook, one that declines, one that raises and one that returns something
that is not a :class:`werk.NativeChatCache` all leave the session "conversation archive only"
without failing the chat, and the last two are reported as ``-v`` phases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import werk
from werk import (
    BackendDescriptor,
    BackendError,
    ModelSpec,
    NativeChatCache,
    NativeContext,
    Runtime,
    TurnOutcome,
    hookimpl,
)
from werk.chat.archive import ChatArchive, SessionStore
from werk.chat.native import native_providers, plugin_native_cache

MakePM = Callable[..., werk.WerkPluginManager]

pytestmark = pytest.mark.anyio


class Cache:
    """A provider that records what it is told."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seen: list[str] = []

    async def before_request(self, body: dict[str, Any]) -> dict[str, Any]:
        self.seen.append("before")
        return {**body, "tag": self.tag}

    async def after_response(self, outcome: TurnOutcome) -> None:
        self.seen.append(f"after complete={outcome.complete}")

    async def close(self) -> None:
        self.seen.append("close")


class Provider:
    """Registers ``backend`` and answers the hook with ``answer`` (called with its kwargs)."""

    def __init__(self, backend: str, answer: Callable[[Runtime, NativeContext], Any]) -> None:
        self.backend = backend
        self.answer = answer
        self.calls: list[tuple[Runtime, NativeContext]] = []

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name=self.backend, formats=("text",)))

    @hookimpl
    def werk_chat_native_cache(self, runtime: Runtime, context: NativeContext) -> Any:
        self.calls.append((runtime, context))
        return self.answer(runtime, context)


class AsyncProvider(Provider):
    @hookimpl
    async def werk_chat_native_cache(self, runtime: Runtime, context: NativeContext) -> Any:
        self.calls.append((runtime, context))
        return self.answer(runtime, context)


class WithoutHook:
    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="bare", formats=("text",)))


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[ChatArchive]:
    with SessionStore(tmp_path / "home").open("s1", model="demo") as opened:
        yield opened


def _context(pm: werk.WerkPluginManager, backend: str, archive: ChatArchive) -> NativeContext:
    model = ModelSpec(id="demo", backend=backend, identity="sha256:" + "0" * 64)
    runtime = Runtime(backend=backend, model=model, generation="g_1")
    phases: list[str] = []
    return NativeContext(
        runtime=runtime,
        native_dir=lambda create: archive.native_dir(create=create),
        phase=phases.append,
    )


def _phases(context: NativeContext) -> list[str]:
    phase = context.phase
    owner = getattr(phase, "__self__", None)
    assert isinstance(owner, list)
    return owner


def test_native_providers_consult_the_plugins() -> None:
    assert native_providers() == [plugin_native_cache]


async def test_only_the_owning_plugin_is_asked(make_pm: MakePM, archive: ChatArchive) -> None:
    mine, theirs = Cache("mine"), Cache("theirs")
    owner = Provider("toy", lambda runtime, context: mine)
    other = Provider("other", lambda runtime, context: theirs)
    pm = make_pm(("werk-other", other), ("werk-toy", owner))
    context = _context(pm, "toy", archive)

    cache = await plugin_native_cache(pm, context)

    assert cache is mine
    assert isinstance(cache, NativeChatCache)
    assert other.calls == []
    assert owner.calls == [(context.runtime, context)]
    assert (await cache.before_request({"model": "demo"}))["tag"] == "mine"


async def test_an_async_implementation_is_awaited(make_pm: MakePM, archive: ChatArchive) -> None:
    mine = Cache("async")
    pm = make_pm(("werk-toy", AsyncProvider("toy", lambda runtime, context: mine)))
    assert await plugin_native_cache(pm, _context(pm, "toy", archive)) is mine


async def test_no_hook_or_declining_means_archive_only(
    make_pm: MakePM, archive: ChatArchive
) -> None:
    declining = Provider("toy", lambda runtime, context: None)
    pm = make_pm(("werk-bare", WithoutHook()), ("werk-toy", declining))
    bare = _context(pm, "bare", archive)
    assert await plugin_native_cache(pm, bare) is None
    assert declining.calls == []  # the hook of a plugin that does not own "bare" is not called

    toy = _context(pm, "toy", archive)
    assert await plugin_native_cache(pm, toy) is None
    assert len(declining.calls) == 1
    assert _phases(bare) == _phases(toy) == []

    assert await plugin_native_cache(pm, _context(pm, "nobody", archive)) is None


async def test_a_failing_provider_never_fails_the_chat(
    make_pm: MakePM, archive: ChatArchive, caplog: pytest.LogCaptureFixture
) -> None:
    def crash(runtime: Runtime, context: NativeContext) -> None:
        raise RuntimeError("boom")

    def refuse(runtime: Runtime, context: NativeContext) -> None:
        raise BackendError("the slot directory is unsafe")

    pm = make_pm(("werk-toy", Provider("toy", crash)), ("werk-werr", Provider("werr", refuse)))
    crashed = _context(pm, "toy", archive)
    assert await plugin_native_cache(pm, crashed) is None
    assert _phases(crashed) == [
        "native KV snapshots: off (the werk-toy provider failed: RuntimeError)"
    ]
    assert "werk_chat_native_cache raised in werk-toy" in caplog.text

    refused = _context(pm, "werr", archive)
    assert await plugin_native_cache(pm, refused) is None
    assert _phases(refused) == ["native KV snapshots: unavailable (the slot directory is unsafe)"]


async def test_a_malformed_provider_is_refused(make_pm: MakePM, archive: ChatArchive) -> None:
    pm = make_pm(("werk-toy", Provider("toy", lambda runtime, context: object())))
    context = _context(pm, "toy", archive)
    assert await plugin_native_cache(pm, context) is None
    assert _phases(context) == ["native KV snapshots: off (the werk-toy provider is malformed)"]
