"""TEST CODE: the ``standin`` backend and its worker caches.

**Runtime (stands for a Werk-managed llama-server).** ``start`` spawns a real child process,
``sleep 600``, in its own session (so a terminal's Ctrl+C never reaches it: only the runtime's
``stop`` ends it) and writes its pid to ``<model file>.pid``. A model file containing a line
``start-delay: N`` makes ``start`` then block for N seconds, like a slow model load; if that
wait is cancelled, the child is killed and reaped, ``<model file>.start-cancelled`` is written
and the cancellation propagates. ``stop`` terminates and reaps the child and writes
``<model file>.stopped`` (``<pid> <returncode>``).

**Replies.** ``werk_openai`` streams ``standin:`` followed by the words of the last user
message in reverse order, one chunk per word, then a finish chunk with usage. A message
containing ``<<hang>>`` streams ``partial`` and then waits forever (until cancelled), so tests
can interrupt a reply midway.

**Worker caches (stands for oMLX workers).** Every directory ``<id>`` under
``WERK_HOME/backends/standin/workers/`` is one cache entry: ``model`` (a file) names its model,
a ``pinned`` file pins it, and a ``lock`` file that another process holds an ``flock`` on makes
it active. ``werk_cache_purge`` takes that lock itself and refuses (``werk.Conflict``) when it
is held.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio

from werk import (
    BackendDescriptor,
    CacheEntry,
    Conflict,
    ModelSpec,
    OpenAICall,
    OpenAIReply,
    Runtime,
    hookimpl,
)

BACKEND = "standin"
HANG = "<<hang>>"
_DELAY = re.compile(r"^start-delay:\s*(\d+(?:\.\d+)?)\s*$", re.MULTILINE)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _mark(model_file: Path, suffix: str, text: str) -> None:
    target = model_file.with_name(model_file.name + suffix)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


async def start(spec: ModelSpec) -> Runtime:
    model_file = spec.files[0]
    delay_match = _DELAY.search(model_file.read_text())
    child = subprocess.Popen(
        ["sleep", "600"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _mark(model_file, ".pid", str(child.pid))
    try:
        if delay_match:
            await anyio.sleep(float(delay_match.group(1)))
    except BaseException:
        child.kill()
        child.wait()
        _mark(model_file, ".start-cancelled", str(child.pid))
        raise
    return Runtime(
        backend=BACKEND,
        model=spec,
        generation=f"g_standin_{child.pid}",
        handle=child,
        args=("--standin",),
    )


async def stop(runtime: Runtime) -> None:
    child = runtime.handle
    runtime.alive = False
    if not isinstance(child, subprocess.Popen):
        return
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
    with anyio.CancelScope(shield=True):
        code = await anyio.to_thread.run_sync(child.wait)
    _mark(runtime.model.files[0], ".stopped", f"{child.pid} {code}")


@hookimpl
def werk_register_backends(register: Callable[[BackendDescriptor], None]) -> None:
    register(
        BackendDescriptor(
            name=BACKEND,
            formats=("standin",),
            description="TEST CODE: owns a real child process (stands for llama-server)",
            start=start,
            stop=stop,
        )
    )


def _chunk(base: dict[str, Any], delta: dict[str, str], finish: str | None) -> bytes:
    payload = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return json.dumps(payload).encode()


@hookimpl
async def werk_openai(runtime: Runtime, call: OpenAICall) -> OpenAIReply:
    messages = call.body.get("messages") or []
    last = str(messages[-1].get("content", "")) if messages else ""
    base = {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": runtime.model.id,
        "system_fingerprint": runtime.generation,
    }

    async def chunks() -> AsyncIterator[bytes]:
        yield _chunk(base, {"role": "assistant"}, None)
        if HANG in last:
            yield _chunk(base, {"content": "partial"}, None)
            await anyio.sleep_forever()
        words = ["standin:", *reversed(last.split())]
        for index, word in enumerate(words):
            await anyio.sleep(0)
            yield _chunk(base, {"content": word if index == 0 else " " + word}, None)
        yield _chunk(base, {}, "stop")
        usage = {"prompt_tokens": len(last), "completion_tokens": len(words)}
        yield json.dumps({**base, "choices": [], "usage": usage}).encode()

    return OpenAIReply(stream=chunks())


# -- worker caches --------------------------------------------------------------------------


def _workers(home: Path) -> Path:
    return home / "backends" / BACKEND / "workers"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _held(lock: Path) -> bool:
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@hookimpl
def werk_cache_inventory(home: Path) -> list[CacheEntry]:
    root = _workers(home)
    if not root.is_dir():
        return []
    entries = []
    for path in sorted(root.iterdir()):
        if not _ID.match(path.name) or path.is_symlink() or not path.is_dir():
            continue
        model_file = path / "model"
        st = path.stat()
        entries.append(
            CacheEntry(
                id=path.name,
                path=path,
                model=model_file.read_text().strip() if model_file.is_file() else None,
                bytes=_size(path),
                created_at=st.st_mtime,
                last_used_at=st.st_mtime,
                active=_held(path / "lock"),
                pinned=(path / "pinned").exists(),
                description="standin worker cache",
            )
        )
    return entries


@hookimpl
def werk_cache_purge(home: Path, entry_id: str) -> bool:
    if not _ID.match(entry_id):
        return False
    path = _workers(home) / entry_id
    if path.is_symlink() or not path.is_dir():
        return False
    lock = path / "lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Conflict(f"standin worker {entry_id} is in use") from None
        shutil.rmtree(path)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return True
