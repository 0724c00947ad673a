"""The process layer against the real llama-server and a generated demo model.

Start → ready → described → stopped and reaped; crashes detected without polling; startup
failures explained from the child's log; the private directory; stale directories swept;
invalid inspection; an executable replaced during startup; PDEATHSIG when Werk is SIGKILLed.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import anyio
import httpx
import msgspec
import psutil
import pytest
from test_llamacpp_process_support import (
    LLAMA_SERVER,
    delayed_wrapper,
    demo_model,
    gone,
    help_filter_wrapper,
    llama_children,
    needs_llama_server,
    self_modifying_wrapper,
    spec_for,
    wait_until,
)
from werk_llamacpp import inspect as llama_inspect
from werk_llamacpp import plugin
from werk_llamacpp.handle import ProbeStatus
from werk_llamacpp.inspect import ExecutableChanged
from werk_llamacpp.process import ManagedHandle, generation_root, start_runtime, stop_runtime
from werk_llamacpp.proxy import openai_reply
from werk_llamacpp.slots import llama_json

from werk import (
    BackendError,
    CapabilityContext,
    InvalidRequest,
    OpenAICall,
    Runtime,
    Unavailable,
    WerkTimeout,
    get_plugin_manager,
)

pytestmark = [pytest.mark.slow, needs_llama_server]

STATE_IDS = (
    "runtime.state.prefix_cache",
    "runtime.state.persistence",
    "runtime.state.restore",
    "runtime.state.tier.disk",
    "runtime.pd.prefill",
    "runtime.pd.decode",
    "runtime.pd.handoff",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "werk-home"
    root.mkdir()
    monkeypatch.setenv("WERK_HOME", str(root))
    assert LLAMA_SERVER is not None
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(LLAMA_SERVER))
    monkeypatch.delenv("WERK_LLAMA_ARGS", raising=False)
    llama_inspect.forget_inspections()
    yield root
    for child in llama_children():
        child.kill()  # a failing test must not leak a server into the next one


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return demo_model(tmp_path / "models")


def rows(runtime: Runtime | None, model: Path) -> dict[str, tuple[str, str]]:
    spec = runtime.model if runtime is not None else spec_for(model)
    context = CapabilityContext(backend="llamacpp", model=spec, runtime=runtime)
    # Through the plugin manager: the host completes the rows the plugin's hooks rule out.
    pm = get_plugin_manager(load_entrypoints=False, plugins=[("werk-llamacpp", plugin)])
    return {r.id: (r.status.value, r.reason or "") for r in pm.capabilities(context)}


async def chat(runtime: Runtime, text: str = "hello") -> dict[str, object]:
    call = OpenAICall(
        route="chat.completions",
        body={"model": "demo", "messages": [{"role": "user", "content": text}], "max_tokens": 4},
    )
    reply = await openai_reply(runtime, call)
    assert reply.body is not None
    return reply.body


@pytest.mark.anyio
async def test_start_describe_and_stop(
    home: Path, model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_API_KEY", "from-the-environment")  # must not become a child key
    runtime = await start_runtime(spec_for(model))
    handle = runtime.handle
    assert isinstance(handle, ManagedHandle)
    pid = handle.pid
    try:
        assert runtime.alive and runtime.generation == handle.generation
        assert runtime.generation.startswith("g_") and len(runtime.generation) == 18
        assert LLAMA_SERVER is not None
        digest = hashlib.sha256(LLAMA_SERVER.read_bytes()).hexdigest()
        assert runtime.executable == f"sha256:{digest}"
        # The envelope args are stable placeholders: no key, port or path.
        assert runtime.args[:8] == (
            *("-m", "<model>", "--host", "127.0.0.1", "--port", "<port>"),
            *("--api-key", "<api-key>"),
        )
        assert handle.api_key not in " ".join(runtime.args + handle.args)
        assert "--no-warmup" in runtime.args and "--cache-ram" in runtime.args
        assert runtime.cache_layout == ("llama.cpp slots v1 n_ctx=4096 n_parallel=5 state_slots=4")
        assert (handle.total_slots, handle.state_slots) == (5, (4,))
        assert handle.probe.status is ProbeStatus.NOT_RUN
        # The private generation directory.
        gen_dir = generation_root() / runtime.generation
        assert handle.slot_dir == gen_dir / "slots"
        for path in (gen_dir, handle.slot_dir, generation_root()):
            assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
        assert handle.log_path == gen_dir / "server.log"
        assert stat.S_IMODE(handle.log_path.stat().st_mode) == 0o600
        # Loopback only, and only Werk's key is accepted.
        listening = [
            c
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert [c.laddr.ip for c in listening] == ["127.0.0.1"]
        async with httpx.AsyncClient(base_url=handle.base_url) as anonymous:
            assert (await anonymous.get("/health")).status_code == 200
            assert (await anonymous.get("/v1/models")).status_code == 401
            for key in ("from-the-environment", "wrong"):
                headers = {"Authorization": f"Bearer {key}"}
                assert (await anonymous.get("/v1/models", headers=headers)).status_code == 401
        assert (await llama_json(handle, "GET", "/v1/models", "model listing"))["data"]
        assert (await chat(runtime))["model"] == "demo"
    finally:
        await stop_runtime(runtime)
    assert not runtime.alive
    assert not psutil.pid_exists(pid)  # reaped by Werk, not left as a zombie
    assert not (generation_root() / runtime.generation).exists()
    await stop_runtime(runtime)  # idempotent


@pytest.mark.anyio
async def test_a_killed_child_is_detected_and_rows_drop(home: Path, model: Path) -> None:
    from werk_llamacpp.probe import ensure_probed

    runtime = await start_runtime(spec_for(model))
    handle = runtime.handle
    assert isinstance(handle, ManagedHandle)
    try:
        before = rows(runtime, model)
        assert before["runtime.model_residency"][0] == "supported"
        assert {before[i][0] for i in STATE_IDS} == {"unavailable"}
        assert "has not run" in before["runtime.pd.prefill"][1]
        result = await ensure_probed(handle)
        assert result.status is ProbeStatus.PASSED, result.reason
        probed = rows(runtime, model)
        assert {probed[i][0] for i in STATE_IDS} == {"experimental"}
        assert probed["runtime.pd.prefill"][1] == (
            f"functional probe passed for process generation {runtime.generation}"
        )
        os.kill(handle.pid, signal.SIGKILL)
        # No call polls the child: the pidfd watcher on the event loop notices the exit.
        with anyio.fail_after(15):
            while runtime.alive:
                await anyio.sleep(0.02)
        assert not psutil.pid_exists(handle.pid)  # reaped
        after = rows(runtime, model)
        assert {after[i][0] for i in STATE_IDS} == {"unavailable"}
        assert runtime.generation in after["runtime.pd.prefill"][1]
        assert after["runtime.state.restore.cross_restart"][0] == "unavailable"
        assert after["runtime.state.tier.ram"][0] == "unsupported"
        # A runtime can still be started again: residency stays supported.
        assert after["runtime.model_residency"][0] == "supported"
        with pytest.raises(Unavailable, match="not running"):
            await chat(runtime)
    finally:
        await stop_runtime(runtime)
    assert not (generation_root() / runtime.generation).exists()


@pytest.mark.anyio
async def test_startup_failure_names_the_reason_without_paths(home: Path, tmp_path: Path) -> None:
    broken = tmp_path / "secret-dir" / "broken.gguf"
    broken.parent.mkdir()
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(4096))
    with pytest.raises(BackendError) as caught:
        await start_runtime(spec_for(broken))
    message = caught.value.message
    assert message.startswith("llama-server exited during startup: ")
    assert "secret-dir" not in message and str(tmp_path) not in message
    assert message != "llama-server exited during startup: no error message in its log"
    assert llama_children() == []
    assert [p.name for p in generation_root().iterdir()] == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "env", "match"),
    [
        ({"native_args": ["--port", "8080"]}, "", "'--port' is not allowed"),
        ({"native_args": ["--slot_save_path", "/tmp"]}, "", "'--slot_save_path' is not allowed"),
        ({}, "--api-key mine", "'--api-key' is not allowed"),
        ({}, "--host 0.0.0.0", "'--host' is not allowed"),
        ({"native_args": ["--no-mmap"]}, "", "not an option this llama-server advertises"),
    ],
)
async def test_native_overrides_are_rejected_before_any_spawn(
    home: Path,
    model: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: dict[str, object],
    env: str,
    match: str,
) -> None:
    monkeypatch.setenv("WERK_LLAMA_ARGS", env)
    with pytest.raises(InvalidRequest, match=match):
        await start_runtime(spec_for(model, options))
    assert llama_children() == []
    assert not generation_root().exists() or list(generation_root().iterdir()) == []


@pytest.mark.anyio
async def test_stale_generation_directories_are_swept(home: Path, model: Path) -> None:
    root = generation_root()
    stale, held = root / "g_stale", root / "g_held"
    for directory in (stale, held):
        (directory / "slots").mkdir(parents=True)
        (directory / "lock").write_text("")
        (directory / "slots" / "leftover.bin").write_bytes(b"x" * 100)
    fd = os.open(held / "lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live Werk still owns this one
    try:
        runtime = await start_runtime(spec_for(model))
        await stop_runtime(runtime)
    finally:
        os.close(fd)
    assert not stale.exists()
    assert (held / "slots" / "leftover.bin").exists()


@pytest.mark.anyio
async def test_invalid_inspection_disables_native_persistence(
    home: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = help_filter_wrapper(tmp_path / "bin" / "llama-server", "--slot-save-path")
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(wrapper))
    runtime = await start_runtime(spec_for(model))
    handle = runtime.handle
    assert isinstance(handle, ManagedHandle)
    try:
        assert "--slot-save-path" not in handle.args and handle.state_slots == ()
        assert handle.probe.status is ProbeStatus.FAILED
        assert "--slot-save-path" in handle.probe.reason
        table = rows(runtime, model)
        assert {table[i][0] for i in STATE_IDS} == {"unavailable"}
        assert "functional probe failed" in table["runtime.pd.prefill"][1]
        assert table["runtime.model_residency"][0] == "supported"
        assert (await chat(runtime))["object"] == "chat.completion"  # /v1 still works
    finally:
        await stop_runtime(runtime)


@pytest.mark.anyio
async def test_an_executable_replaced_during_startup_is_refused(
    home: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = self_modifying_wrapper(tmp_path / "bin" / "llama-server")
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(wrapper))
    with pytest.raises(ExecutableChanged, match="changed while the model was starting"):
        await start_runtime(spec_for(model))
    assert llama_children() == []
    assert list(generation_root().iterdir()) == []


@pytest.mark.anyio
async def test_startup_timeout_kills_the_child(
    home: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wrapper = delayed_wrapper(tmp_path / "bin" / "llama-server", delay=60)
    monkeypatch.setenv("WERK_LLAMA_SERVER", str(wrapper))
    with pytest.raises(WerkTimeout, match="did not become ready within 1s"):
        await start_runtime(spec_for(model, {"startup_timeout": 1}))
    assert llama_children() == []


HELPER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import anyio
    from werk import ModelSpec
    from werk_llamacpp.process import start_runtime

    async def main():
        spec = ModelSpec(id="demo", backend="llamacpp", identity="sha256:x",
                         files=(Path(sys.argv[1]),))
        runtime = await start_runtime(spec)
        print(json.dumps({"pid": runtime.handle.pid}), flush=True)
        await anyio.sleep(3600)

    anyio.run(main)
    """
)


def test_children_die_with_a_sigkilled_parent(home: Path, model: Path, tmp_path: Path) -> None:
    script = tmp_path / "helper.py"
    script.write_text(HELPER)
    helper = subprocess.Popen(
        [sys.executable, str(script), str(model)],
        stdout=subprocess.PIPE,
        env=os.environ.copy(),
    )
    child_pid = None
    try:
        assert helper.stdout is not None
        line = helper.stdout.readline()
        assert line, "the helper did not start a runtime"
        child_pid = json.loads(line)["pid"]
        assert not gone(child_pid)
        helper.kill()  # SIGKILL: no handler, no cleanup code runs in the parent
        helper.wait()
        assert wait_until(lambda: gone(child_pid), timeout=15), "llama-server outlived Werk"
    finally:
        if helper.poll() is None:
            helper.kill()
            helper.wait()
        if helper.stdout is not None:
            helper.stdout.close()
        if child_pid is not None and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


@pytest.mark.anyio
async def test_a_restart_probes_early_and_a_chat_reserves_the_state_slot_after_it(
    home: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first generation leaves a canary; the next one probes as soon as it is ready (no
    Prefill), and ``werk chat``'s native cache, which takes the state slot without the probe,
    reserves it only after the early probe (which takes and retires the slot) is done. Reading
    the canary is slowed down so that the chat would otherwise take the slot first."""
    from test_llamacpp_chat_snapshots import NativeDir
    from werk_llamacpp import probe
    from werk_llamacpp.chat_snapshots.hook import open_chat_cache
    from werk_llamacpp.probe import ensure_probed
    from werk_llamacpp.slots import allocator_for

    load_canary = probe.load_canary

    def slow_load_canary(lineage: str) -> object:
        time.sleep(0.5)
        return load_canary(lineage)

    monkeypatch.setattr(probe, "load_canary", slow_load_canary)

    from werk import NativeContext

    first = await start_runtime(spec_for(model))
    try:
        assert isinstance(first.handle, ManagedHandle) and first.handle.early_probe is not None
        assert (await first.handle.early_probe).status is ProbeStatus.NOT_RUN  # no canary yet
        assert (await ensure_probed(first.handle)).status is ProbeStatus.PASSED  # leaves one
    finally:
        await stop_runtime(first)
    second = await start_runtime(spec_for(model))
    handle = second.handle
    assert isinstance(handle, ManagedHandle) and handle.early_probe is not None
    phases: list[str] = []
    try:
        context = NativeContext(
            runtime=second, native_dir=NativeDir(tmp_path / "native"), phase=phases.append
        )
        cache = await open_chat_cache(second, context)
        assert handle.early_probe.done()
        assert handle.cross_restart.status is ProbeStatus.PASSED, handle.cross_restart.reason
        assert cache is not None, phases
        assert allocator_for(handle).current(cache.slot, cache.epoch)  # not retired by the probe
        await cache.close()
    finally:
        await stop_runtime(second)


@pytest.mark.anyio
async def test_a_rehash_begun_early_is_what_the_check_after_readiness_compares(
    home: Path, model: Path
) -> None:
    """The plugin's start begins the executable's re-hash before the process layer is imported
    and hands it to ``start_runtime``: that digest, not a new one, is compared after readiness
    (a wrong one refuses the start); one begun for another inspection is not used."""
    assert LLAMA_SERVER is not None
    inspection = await llama_inspect.inspect_executable(LLAMA_SERVER)
    wrong: Future[str] = Future()
    wrong.set_result("0" * 64)
    with pytest.raises(ExecutableChanged, match="changed while the model was starting"):
        await start_runtime(spec_for(model), rehash=(inspection, wrong))
    assert llama_children() == []
    other = msgspec.structs.replace(inspection)  # equal, but not the inspection this start uses
    runtime = await start_runtime(spec_for(model), rehash=(other, wrong))
    try:
        assert runtime.alive
    finally:
        await stop_runtime(runtime)
