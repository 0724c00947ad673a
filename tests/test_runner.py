"""Runners (:func:`werk.run_generation`): one real process per request speaking the runner
contract — small standard-library Python programs standing in for an ONNX Runtime or MLX
runner — and what Werk makes of each way it can end."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from pathlib import Path

import anyio
import psutil
import pytest

from werk import BackendError, OpenAICall, WerkTimeout, generation_reply, run_generation

pytestmark = pytest.mark.anyio

RUNNER = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    request = json.loads(sys.stdin.readline())
    mode = request.get("mode", "ok")
    print("runner log line", file=sys.stderr, flush=True)
    def out(obj):
        print(json.dumps(obj), flush=True)
    if mode == "ok":
        for i, word in enumerate(request["prompt"].split()):
            out({"delta": word.upper() + " ", "ids": [i]})
        out({"done": True, "finish_reason": "length",
             "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    elif mode == "invalid":
        out({"error": "the prompt is too long", "kind": "invalid"})
        sys.exit(2)
    elif mode == "fail-after-delta":
        out({"delta": "x"})
        print("Traceback: boom", file=sys.stderr, flush=True)
        out({"error": "boom"})
        sys.exit(1)
    elif mode == "exit":
        out({"delta": "x"})
        sys.exit(7)
    elif mode == "garbage":
        print("not json", flush=True)
    elif mode == "slow":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        open("child.pid", "w").write(str(child.pid))
        for i in range(600):
            out({"delta": str(i)})
            time.sleep(0.1)
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def runner(tmp_path: Path) -> list[str]:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    return [sys.executable, str(script)]


async def _run(runner: list[str], tmp_path: Path, **request: object) -> tuple[list, dict | None]:
    async with run_generation(runner, request, kind="toy", runs_dir=tmp_path / "runs") as run:
        events = [event async for event in run]
    return events, run.result


async def test_deltas_then_the_result(runner: list[str], tmp_path: Path) -> None:
    events, result = await _run(runner, tmp_path, prompt="a b")
    assert events == [{"text": "A ", "ids": [0]}, {"text": "B ", "ids": [1]}]
    assert result == {
        "finish_reason": "length",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    assert list((tmp_path / "runs").iterdir()) == []  # its run directory is gone


async def test_an_invalid_request_is_a_refusal(runner: list[str], tmp_path: Path) -> None:
    events, result = await _run(runner, tmp_path, mode="invalid")
    assert events == [] and result == {"refused": "the prompt is too long"}


@pytest.mark.parametrize(
    ("mode", "text"),
    [
        (
            "fail-after-delta",
            "the toy runner failed: boom; (status 1): runner log line\nTraceback: boom",
        ),
        ("exit", "the toy runner exited without a result (status 7): runner log line"),
        ("garbage", "wrote a line that is not a JSON object"),
    ],
)
async def test_a_failed_runner_is_a_backend_error_with_its_stderr(
    runner: list[str], tmp_path: Path, mode: str, text: str
) -> None:
    with pytest.raises(BackendError) as raised:
        await _run(runner, tmp_path, mode=mode)
    assert text in raised.value.message


async def test_the_timeout_kills_the_runner(runner: list[str], tmp_path: Path) -> None:
    with pytest.raises(WerkTimeout, match="did not finish in time"):
        async with run_generation(
            runner, {"mode": "slow"}, kind="toy", runs_dir=tmp_path / "runs", timeout=0.5
        ) as run:
            async for _ in run:
                pass
    assert not psutil.pid_exists(run.process.pid)


async def test_leaving_early_kills_the_runner_and_its_children(
    runner: list[str], tmp_path: Path
) -> None:
    async with run_generation(
        runner, {"mode": "slow"}, kind="toy", runs_dir=tmp_path / "runs"
    ) as run:
        await anext(aiter(run))
        pid_file = next((tmp_path / "runs").iterdir()) / "child.pid"
        while not pid_file.exists():
            await anyio.sleep(0.01)
        child = int(pid_file.read_text())
    assert not psutil.pid_exists(run.process.pid)
    for _ in range(100):
        if not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            break
        await anyio.sleep(0.05)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


async def test_a_runner_answers_an_openai_stream(runner: list[str], tmp_path: Path) -> None:
    call = OpenAICall(route="completions", body={"model": "m", "prompt": "x"}, stream=True)
    generation = run_generation(
        runner, {"prompt": "hello there"}, kind="toy", runs_dir=tmp_path / "runs"
    )
    reply = await generation_reply(call, "m", generation)
    assert reply.stream is not None
    chunks = [json.loads(payload) async for payload in reply.stream]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "HELLO THERE "
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert os.listdir(tmp_path / "runs") == []


RUN_ONCE = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
    from werk_companion_frames import run_once

    def generate(request):
        print("a library printing to stdout")  # must not break the protocol
        if request["mode"] == "refuse":
            return {"refused": "too long"}
        if request["mode"] == "raise":
            raise ValueError("bad weights")
        yield {"text": "hi", "ids": [7]}
        return {"finish_reason": "stop", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}

    run_once(generate)
    """
)


@pytest.mark.parametrize(
    ("mode", "events", "result", "error"),
    [
        ("ok", [{"text": "hi", "ids": [7]}], "stop", None),
        ("refuse", [], None, None),
        ("raise", [], None, "the toy runner failed: ValueError: bad weights; (status 1)"),
    ],
)
async def test_a_python_runner_on_run_once_speaks_the_contract(
    tmp_path: Path, mode: str, events: list, result: str | None, error: str | None
) -> None:
    script = tmp_path / "run_once.py"
    script.write_text(RUN_ONCE)
    if error is not None:
        with pytest.raises(BackendError, match=re.escape(error)):
            await _run([sys.executable, str(script)], tmp_path, mode=mode)
        return
    got, final = await _run([sys.executable, str(script)], tmp_path, mode=mode)
    assert got == events
    assert final is not None
    assert final.get("finish_reason") == result
    if mode == "refuse":
        assert final == {"refused": "too long"}
