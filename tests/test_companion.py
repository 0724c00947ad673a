"""The host's companion-worker module against a real worker process (a small standard-library
script that serves ``werk_companion_frames``, as a backend's worker does in its own Python)."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from werk import CompanionWorker, WorkerGone
from werk.protocol import InvalidRequest, ResourceExhausted, Unsupported, WerkTimeout

pytestmark = pytest.mark.anyio

WORKER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
    from werk_companion_frames import LoadedLRU, RequestError, serve

    loaded = []
    released = []
    lru = LoadedLRU(
        int(os.environ.get("TOY_CAPACITY", "2")),
        lambda key: (key.upper(), {"bytes": len(key)}),
        lambda: released.append(1),
    )

    def handle(op, args):
        if op == "health":
            return {"pid": os.getpid(), "resident": loaded}
        if op == "execute":
            print("library chatter on stdout")  # must land in the log, not in the protocol
            time.sleep(float(args.get("sleep", 0)))
            loaded.append({"path": args["path"], "bytes": 10})
            return {"echo": args["path"], "resident": loaded}
        if op == "refuse":
            raise RequestError(args["kind"], "no, because")
        if op == "load":
            value = lru.get(args["key"])
            lru.after_request()
            return {"value": value, "released": len(released), "resident": lru.resident()}
        if op == "crash":
            os._exit(3)
        if op == "count":
            return count(int(args["to"]), float(args.get("sleep", 0)), args.get("die_at"))
        raise RuntimeError("boom")

    stopped = []

    def count(to, sleep, die_at):
        try:
            for n in range(to):
                if n == die_at:
                    os._exit(4)
                time.sleep(sleep)
                yield {"n": n}
            return {"counted": to, "resident": loaded}
        finally:
            stopped.append(True)  # a cancelled stream's generator is closed: its work stops

    serve(handle, cancel_result=lambda: {"stopped": len(stopped), "resident": loaded})
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


async def _spawn(
    script: Path, tmp_path: Path, env: dict[str, str] | None = None, **kwargs: object
) -> CompanionWorker:
    return await CompanionWorker.spawn(
        [sys.executable, str(script)],
        kind="toy",
        runs_dir=tmp_path / "runs",
        env={**os.environ, **(env or {})},
        **kwargs,  # type: ignore[arg-type]
    )


async def test_a_worker_answers_health_then_requests_and_reports_residency(
    script: Path, tmp_path: Path
) -> None:
    worker = await _spawn(script, tmp_path)
    try:
        assert worker.health["pid"] == worker.process.pid and worker.alive()
        assert worker.generation.startswith("g_")
        result = await worker.request("execute", {"path": "m1"})
        assert result["echo"] == "m1"
        assert worker.resident == [{"path": "m1", "bytes": 10}]
        assert "library chatter on stdout" in worker.process.log_tail(4096)
    finally:
        await worker.stop()
    assert not worker.alive() and not worker.workdir.path.exists()


@pytest.mark.parametrize(
    ("op", "args", "error", "text"),
    [
        ("refuse", {"kind": "invalid"}, InvalidRequest, "no, because"),
        ("refuse", {"kind": "unsupported"}, Unsupported, "no, because"),
        ("other", {}, WorkerGone, "failed other: RuntimeError: boom"),
        ("crash", {}, WorkerGone, "exited during crash (status 3)"),
    ],
)
async def test_any_failure_is_typed_and_ends_the_worker(
    script: Path, tmp_path: Path, op: str, args: dict[str, str], error: type, text: str
) -> None:
    ended: list[bool] = []
    worker = await _spawn(script, tmp_path)
    worker.on_end(lambda: ended.append(True))
    with pytest.raises(error, match=re.escape(text)):
        await worker.request(op, args)
    assert ended == [True] and not worker.alive()
    with pytest.raises(Exception, match="ended before this request reached it"):
        await worker.request("execute", {"path": "m2"})  # never sent to a dead worker


async def test_a_timeout_stops_the_worker(script: Path, tmp_path: Path) -> None:
    worker = await _spawn(script, tmp_path)
    with pytest.raises(WerkTimeout, match="did not answer execute"):
        await worker.request("execute", {"path": "slow", "sleep": 30}, timeout=0.5)
    assert not worker.alive() and worker.process.poll() is not None


async def test_requests_wait_in_line_up_to_the_bound(script: Path, tmp_path: Path) -> None:
    worker = await _spawn(script, tmp_path, max_waiting=lambda: 1, waiting_setting="TOY_WAIT")
    results: list[str] = []
    refused: list[ResourceExhausted] = []

    async def execute(path: str) -> None:
        try:
            results.append((await worker.request("execute", {"path": path, "sleep": 0.3}))["echo"])
        except ResourceExhausted as exc:
            refused.append(exc)

    try:
        async with anyio.create_task_group() as group:
            for path in ("a", "b", "c"):
                group.start_soon(execute, path)
                await anyio.sleep(0.05)
    finally:
        await worker.stop()
    assert results == ["a", "b"]  # first come, first served; one waited
    (refusal,) = refused
    assert "TOY_WAIT=1" in refusal.message and refusal.retry_after is not None


@pytest.mark.parametrize(
    ("capacity", "kept"),
    [("2", [["a"], ["a", "bb"], ["bb", "a"], ["a", "ccc"]]), ("0", [[], [], [], []])],
)
async def test_the_worker_lru_keeps_the_most_recent_entries_and_reports_them(
    script: Path, tmp_path: Path, capacity: str, kept: list[list[str]]
) -> None:
    worker = await _spawn(script, tmp_path, env={"TOY_CAPACITY": capacity})
    try:
        for key, expected in zip(("a", "bb", "a", "ccc"), kept, strict=True):
            result = await worker.request("load", {"key": key})
            assert result["value"] == key.upper()
            assert [entry["path"] for entry in worker.resident] == expected
            assert all(entry["bytes"] == len(entry["path"]) for entry in worker.resident)
        assert result["released"] == (1 if capacity == "2" else 4)  # each drop released
    finally:
        await worker.stop()


async def test_a_stream_gives_the_events_then_the_result(script: Path, tmp_path: Path) -> None:
    worker = await _spawn(script, tmp_path)
    try:
        async with worker.streaming("count", {"to": 3}) as stream:
            events = [event async for event in stream]
        assert events == [{"n": 0}, {"n": 1}, {"n": 2}]
        assert stream.result == {"counted": 3, "resident": []} and stream.finished
        assert (await worker.request("execute", {"path": "after"}))["echo"] == "after"
    finally:
        await worker.stop()


async def test_leaving_a_stream_early_cancels_it_and_the_worker_stays_warm(
    script: Path, tmp_path: Path
) -> None:
    worker = await _spawn(script, tmp_path)
    pid = worker.process.pid
    try:
        async with worker.streaming("count", {"to": 1000, "sleep": 0.01}) as stream:
            async for event in stream:
                if event["n"] == 2:
                    break
        assert stream.result is not None and stream.result["cancelled"] is True
        assert stream.result["stopped"] == 1  # the handler's generator was closed
        assert worker.alive() and worker.process.pid == pid
        assert (await worker.request("execute", {"path": "next"}))["echo"] == "next"
    finally:
        await worker.stop()


async def test_a_caller_cancelled_while_it_waits_for_an_event_leaves_the_worker_warm(
    script: Path, tmp_path: Path
) -> None:
    """A client that goes away cancels the task reading the stream mid-read: the pending
    line is not lost, the host cancels the stream and reads its reply."""
    worker = await _spawn(script, tmp_path)
    seen: list[int] = []
    try:
        with anyio.move_on_after(0.5):
            async with worker.streaming("count", {"to": 100, "sleep": 0.2}) as stream:
                async for event in stream:
                    seen.append(event["n"])
        assert seen and stream.finished and stream.result is not None
        assert stream.result["cancelled"] is True
        assert worker.alive()
        async with worker.streaming("count", {"to": 2}) as again:
            assert [event["n"] async for event in again] == [0, 1]
    finally:
        await worker.stop()


async def test_a_caller_already_cancelled_when_it_asks_for_an_event_loses_no_frame(
    script: Path, tmp_path: Path
) -> None:
    """Cancelled before its read could start (a client gone between two events): the read
    still happens, and the cancel that follows finds the worker's frames in order."""
    worker = await _spawn(script, tmp_path)
    try:
        with anyio.CancelScope() as scope:
            async with worker.streaming("count", {"to": 100, "sleep": 0.05}) as stream:
                assert (await stream.__anext__()) == {"n": 0}
                scope.cancel()
                await stream.__anext__()
        assert stream.result is not None and stream.result["cancelled"] is True
        assert worker.alive()
        assert (await worker.request("execute", {"path": "next"}))["echo"] == "next"
    finally:
        await worker.stop()


async def test_a_worker_that_dies_mid_stream_is_a_typed_error(script: Path, tmp_path: Path) -> None:
    worker = await _spawn(script, tmp_path)
    seen: list[int] = []
    with pytest.raises(WorkerGone, match=re.escape("exited during count (status 4)")):
        async with worker.streaming("count", {"to": 5, "die_at": 2}) as stream:
            async for event in stream:
                seen.append(event["n"])
    assert seen == [0, 1] and not worker.alive()


async def test_a_request_waits_for_a_running_stream(script: Path, tmp_path: Path) -> None:
    worker = await _spawn(script, tmp_path)
    order: list[str] = []

    async def stream() -> None:
        async with worker.streaming("count", {"to": 3, "sleep": 0.1}) as events:
            async for event in events:
                order.append(f"event {event['n']}")

    async def request() -> None:
        await anyio.sleep(0.05)
        order.append((await worker.request("execute", {"path": "queued"}))["echo"])

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(stream)
            group.start_soon(request)
        assert order == ["event 0", "event 1", "event 2", "queued"]
    finally:
        await worker.stop()
