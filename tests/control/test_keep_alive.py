"""Keep-alive: a runtime idle past its keep-alive is unloaded, never one that is busy or
protected; a /v1 request's own ``keep_alive`` replaces the server's; ``GET /werk/v1/runtimes``
lists what is loaded. The idle unloader runs for real (real time, bounded waits)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

import werk
from werk import (
    BackendDescriptor,
    InvalidRequest,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    hookimpl,
)
from werk.control.runtimes import KeepAlive, RuntimeManager
from werk.protocol.residency import parse_keep_alive
from werk.testing.service import local_service

SPEC = ModelSpec(id="m", backend="idle", identity="sha256:" + "5" * 64)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """Counts starts and stops; streams three chunks; records the bodies it was sent."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    async def start(self, spec: ModelSpec) -> Runtime:
        generation = f"g_{len(self.started)}"
        self.started.append(generation)
        return Runtime(backend=spec.backend, model=spec, generation=generation, pid=None)

    async def stop(self, runtime: Runtime) -> None:
        self.stopped.append(runtime.generation)
        runtime.alive = False

    @hookimpl
    def werk_register_backends(self, register: Callable[[BackendDescriptor], None]) -> None:
        register(BackendDescriptor(name="idle", start=self.start, stop=self.stop))

    @hookimpl
    def werk_openai(self, runtime: Runtime, call: OpenAICall) -> OpenAIReply:
        self.bodies.append(call.body)
        if call.stream:

            async def chunks() -> Any:
                for n in range(3):
                    yield b'{"n": %d}' % n

            return OpenAIReply(stream=chunks())
        return OpenAIReply(body={"choices": []})


def manager(backend: Backend, clock: Clock, keep_alive: float | None = 10.0) -> RuntimeManager:
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("idle", backend)])
    return RuntimeManager(pm, clock=clock, wall=lambda: 1_700_000_000.0, keep_alive=keep_alive)


@pytest.mark.anyio
async def test_an_idle_runtime_is_unloaded_after_its_keep_alive_and_not_before() -> None:
    backend, clock = Backend(), Clock()
    runtimes = manager(backend, clock)
    with await runtimes.use(SPEC):
        clock.now += 60
        assert await runtimes.unload_idle() == []  # busy, however long
    assert runtimes.seconds_to_next_unload() == 10.0
    [entry] = runtimes.entries()
    assert entry.busy == 0 and entry.keep_alive == 10.0
    assert entry.idle_until == 1_700_000_000.0 + 10.0
    clock.now += 9.9
    assert await runtimes.unload_idle() == []
    clock.now += 0.2
    assert await runtimes.unload_idle() == ["m"]
    assert backend.stopped == ["g_0"] and runtimes.entries() == []
    with await runtimes.use(SPEC) as use:  # the next use starts a new generation
        assert use.runtime.generation == "g_1"


@pytest.mark.anyio
async def test_protected_generations_and_never_stay_loaded() -> None:
    backend, clock = Backend(), Clock()
    runtimes = manager(backend, clock, keep_alive=None)
    with await runtimes.use(SPEC):
        pass
    clock.now += 10**6
    assert runtimes.seconds_to_next_unload() is None
    assert await runtimes.unload_idle() == []
    runtimes.keep_alive = 1.0
    with await runtimes.use(SPEC) as use:
        generation = use.runtime.generation
    clock.now += 5
    assert await runtimes.unload_idle(protected={generation}) == []  # a live handoff, say
    assert await runtimes.unload_idle() == ["m"]


@pytest.mark.anyio
async def test_a_requests_keep_alive_replaces_the_servers_for_that_model() -> None:
    backend, clock = Backend(), Clock()
    runtimes = manager(backend, clock, keep_alive=300.0)
    use = await runtimes.use(SPEC)
    use.release(KeepAlive(0.0))
    use.release(KeepAlive(999.0))  # a second release changes nothing
    assert await runtimes.unload_idle() == ["m"]
    use = await runtimes.use(SPEC)
    use.release(KeepAlive(None))
    clock.now += 10**6
    assert await runtimes.unload_idle() == []
    [entry] = runtimes.entries()
    assert entry.keep_alive is None and entry.idle_until is None


@pytest.mark.anyio
async def test_a_release_wakes_the_sleeping_unloader_only_when_its_keep_alive_ends_sooner() -> None:
    """The unloader sleeps up to a second and looks at every deadline when it wakes; a release
    whose keep-alive runs out later than that does not wake it (not after every request), a
    release with a shorter keep-alive does."""
    backend, clock = Backend(), Clock()
    runtimes = manager(backend, clock, keep_alive=300.0)
    woke: list[float] = []

    async def sleeper() -> None:
        await runtimes.wait_for_release(5.0)
        woke.append(clock.now)

    async with anyio.create_task_group() as group:
        group.start_soon(sleeper)
        await anyio.wait_all_tasks_blocked()
        (await runtimes.use(SPEC)).release()  # idle until now + 300 s: after the wake-up
        await anyio.wait_all_tasks_blocked()
        assert woke == []
        clock.now += 1
        (await runtimes.use(SPEC)).release(KeepAlive(2.0))  # now + 2 s: before it
        await anyio.wait_all_tasks_blocked()
        assert woke == [101.0]


@pytest.mark.anyio
async def test_a_use_never_takes_a_runtime_whose_stop_holds_the_lock() -> None:
    """A use skips the model's lock only when nobody holds it. A stop that has taken the lock
    (and not yet unregistered the runtime: the lock's acquire yields once) makes the use wait;
    it then gets a new generation, never the one being stopped."""
    backend, clock = Backend(), Clock()
    runtimes = manager(backend, clock)
    with await runtimes.use(SPEC):
        pass
    got: list[tuple[str, bool]] = []

    async def user() -> None:
        with await runtimes.use(SPEC) as use:
            got.append((use.runtime.generation, use.runtime.alive))

    async with anyio.create_task_group() as group:
        group.start_soon(runtimes.stop, "m")  # runs first: takes the lock, then yields
        group.start_soon(user)
    assert backend.stopped == ["g_0"]
    assert got == [("g_1", True)]


@pytest.mark.anyio
async def test_a_use_right_after_the_process_exited_gets_a_new_runtime() -> None:
    """The plugin has not heard of its child's exit yet (``alive`` still true), but the
    runtime's own process is gone: the next use starts a new generation instead of handing out
    the dead one, and the crash is counted. The exit stays unreaped for its plugin."""
    children: list[subprocess.Popen[bytes]] = []

    class ProcessBackend(Backend):
        async def start(self, spec: ModelSpec) -> Runtime:
            runtime = await super().start(spec)
            children.append(subprocess.Popen(["sleep", "60"]))
            runtime.pid = children[-1].pid
            return runtime

    backend, clock = ProcessBackend(), Clock()
    runtimes = manager(backend, clock)
    try:
        with await runtimes.use(SPEC) as use:
            first = use.runtime
        with await runtimes.use(SPEC) as use:  # still alive: the same runtime
            assert use.runtime is first
        children[0].kill()
        while psutil.Process(children[0].pid).status() != psutil.STATUS_ZOMBIE:
            await anyio.sleep(0.01)
        assert first.alive  # nobody told the flag
        with await runtimes.use(SPEC) as use:
            assert use.runtime.generation == "g_1" and use.runtime.alive
        assert not first.alive and backend.stopped == ["g_0"]
        assert runtimes.event_counts()["idle"] == {"starts": 2, "crashes": 1, "restarts": 1}
        assert children[0].poll() == -signal.SIGKILL  # left for its owner to reap
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_keep_alive_values() -> None:
    assert parse_keep_alive(0) == 0.0 and parse_keep_alive("300ms") == 0.3
    assert parse_keep_alive("5m") == 300.0 and parse_keep_alive("1h30m") == 5400.0
    assert parse_keep_alive("10") == 10.0 and parse_keep_alive(2.5) == 2.5
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1") is None
    assert parse_keep_alive("-5m") is None
    for bad in ("", "x", "5x", "1h 2m", "-", True, None, [], float("nan"), 10**9):
        with pytest.raises(InvalidRequest):
            parse_keep_alive(bad)


async def _wait_for(predicate: Callable[[], bool], seconds: float = 5.0) -> None:
    with anyio.fail_after(seconds):
        while not predicate():
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_the_unloader_stops_a_runtime_after_a_zero_keep_alive_request(
    tmp_path: Path,
) -> None:
    backend = Backend()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("idle", backend)])
    body = {"model": "m", "messages": [], "keep_alive": 0}
    async with (
        local_service([SPEC], home=tmp_path, pm=pm, keep_alive_seconds=None) as service,
        anyio.create_task_group() as group,
    ):
        await group.start(service.run_idle_unloads)
        await service.openai_request("local", "chat.completions", body)
        assert "keep_alive" not in backend.bodies[0]  # Werk's field, never forwarded
        await _wait_for(lambda: backend.stopped == ["g_0"])
        assert (await service.runtimes_listing()).runtimes == []
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_stream_keeps_its_runtime_busy_until_it_is_closed(tmp_path: Path) -> None:
    backend = Backend()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("idle", backend)])
    body = {"model": "m", "messages": [], "stream": True, "keep_alive": "0s"}
    async with (
        local_service([SPEC], home=tmp_path, pm=pm) as service,
        anyio.create_task_group() as group,
    ):
        await group.start(service.run_idle_unloads)
        reply = await service.openai_request("local", "chat.completions", body)
        assert reply.stream is not None
        [listed] = (await service.runtimes_listing()).runtimes
        assert listed.busy == 1 and listed.idle_until is None and listed.pid is None
        assert listed.model == "m" and listed.backend == "idle" and listed.observed_bytes is None
        await anyio.sleep(0.3)
        assert backend.stopped == []  # streaming: busy
        assert [chunk async for chunk in reply.stream] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
        await reply.stream.aclose()  # type: ignore[attr-defined]
        await _wait_for(lambda: backend.stopped == ["g_0"])
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_bad_keep_alive_is_refused_before_anything_starts(tmp_path: Path) -> None:
    backend = Backend()
    pm = werk.get_plugin_manager(load_entrypoints=False, plugins=[("idle", backend)])
    async with local_service([SPEC], home=tmp_path, pm=pm) as service:
        with pytest.raises(InvalidRequest, match="keep_alive"):
            await service.openai_request(
                "local", "chat.completions", {"model": "m", "keep_alive": "soon"}
            )
    assert backend.started == []


def test_pinned_in_memory_states_protect_their_generation() -> None:
    from werk import BackendState, StateKind
    from werk.control.volatile import VolatileStates
    from werk.state.envelope import Envelope

    clock = Clock()
    states = VolatileStates(clock=clock)

    def add(generation: str, *, pinned: bool, ttl: int | None = None) -> None:
        envelope = Envelope(
            adapter="t", adapter_version="1", backend="idle", executable="",
            model_identity=SPEC.identity, runtime_args=(), cache_layout="t",
            generation=generation, principal="local",
        )  # fmt: skip
        state = BackendState(kind=StateKind.HANDLE, generation=generation, handle=object())
        states.add(
            principal="local", envelope=envelope, model="m", backend="idle",
            fingerprint="pf_" + "0" * 64, state=state, ttl_seconds=ttl, pinned=pinned,
        )  # fmt: skip

    add("g_plain", pinned=False)
    add("g_pinned", pinned=True)
    add("g_brief", pinned=True, ttl=5)
    assert states.pinned_generations() == {"g_pinned", "g_brief"}
    clock.now += 5
    assert states.pinned_generations() == {"g_pinned"}  # an expired pin protects nothing
