"""A backend's shared companion worker (:class:`werk.CompanionBackend`) against a real worker
process (a standard-library script serving ``werk_companion_frames``), and the worker side's
text assembly (``GeneratedText``) and chat-template check."""

from __future__ import annotations

import importlib.util
import os
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from werk import (
    CapabilityContext,
    CompanionBackend,
    CompanionWorker,
    FoundPython,
    ModelSpec,
    Runtime,
    Unavailable,
)
from werk.companion import frames_dir

pytestmark = pytest.mark.anyio

WORKER = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, os.environ["WERK_COMPANION_FRAMES"])
    from werk_companion_frames import LoadedLRU, serve

    models = LoadedLRU(2, lambda key: (key, {"bytes": len(key)}))
    unloaded = []

    def handle(op, args):
        if op == "health":
            return {"pid": os.getpid(), "versions": {"toylib": "1.0"}, "resident": []}
        if op == "capabilities":
            return {"cache_size": models.capacity}
        if op == "load":
            models.get(args["path"])
            return {"resident": models.resident()}
        if op == "unload":
            unloaded.append(args["path"])
            return {"unloaded": models.drop(args["path"]), "resident": models.resident()}
        if op == "unloaded":
            return {"paths": unloaded}
        raise RuntimeError(op)

    serve(handle)
    """
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(eq=False)
class Handle:
    worker: CompanionWorker
    path: str


def _backend(tmp_path: Path, found: bool = True) -> CompanionBackend[CompanionWorker]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)

    async def start() -> CompanionWorker:
        worker = await CompanionWorker.spawn(
            [sys.executable, str(script)], kind="toy", runs_dir=tmp_path / "runs"
        )
        return await worker.handshake()

    def locate() -> FoundPython:
        if not found:
            raise Unavailable("toylib is not installed; run `werk backends install toy`")
        return FoundPython(Path(sys.executable), "the test")

    return CompanionBackend(
        "toy", start, locate, entry="model", capacity_setting="TOY_SIZE", held="toy bytes"
    )


async def _runtime(shared: CompanionBackend[CompanionWorker], path: str) -> Runtime:
    worker = await shared.running()
    await worker.request("load", {"path": path})
    spec = ModelSpec(id=path, backend="toy", identity="sha256:" + "c" * 64)
    runtime = Runtime(
        backend="toy", model=spec, generation=worker.generation, handle=Handle(worker, path)
    )
    return shared.attach(runtime)


def _reason(shared: CompanionBackend[CompanionWorker], runtime: Runtime | None = None) -> str:
    context = CapabilityContext(backend="toy", runtime=runtime)
    return shared.residency(context, lambda r: r.handle.path).reason


async def test_runtimes_share_one_worker_that_unloads_then_ends_with_the_last(
    tmp_path: Path,
) -> None:
    shared = _backend(tmp_path)
    assert _reason(shared).startswith("no toy worker is running (its python from the test)")
    a, b = await _runtime(shared, "alpha"), await _runtime(shared, "beta")
    worker = shared.worker
    assert worker is not None and a.handle.worker is b.handle.worker is worker
    assert worker.versions == {"toylib": "1.0"} and worker.capacity == 2
    assert _reason(shared, a) == (
        f"its model is resident; the toy worker (pid {worker.process.pid}) keeps 2 of at most 2 "
        "model(s) (TOY_SIZE), 9 bytes of toy bytes"
    )
    await shared.detach(a, {"path": "alpha"})
    assert not a.alive and worker.alive()
    assert (await worker.request("unloaded", {}))["paths"] == ["alpha"]
    assert _reason(shared, a).startswith("its model is not loaded now; the toy worker")
    assert "keeps 1 of at most 2 model(s)" in _reason(shared, a)
    await shared.detach(b, {"path": "beta"})
    assert not worker.alive() and shared.worker is None


async def test_a_worker_that_ends_marks_its_runtimes_dead_and_the_next_start_is_new(
    tmp_path: Path,
) -> None:
    shared = _backend(tmp_path)
    runtime = await _runtime(shared, "alpha")
    first = shared.worker
    assert first is not None
    first.process.kill_now()
    await first.stop()
    assert not runtime.alive
    again = await _runtime(shared, "alpha")
    assert shared.worker is not first and again.handle.worker is shared.worker
    await shared.detach(again, {"path": "alpha"})


def test_without_a_python_the_row_is_unavailable_with_its_reason(tmp_path: Path) -> None:
    row = _backend(tmp_path, found=False).residency(CapabilityContext(backend="toy"), lambda r: "")
    assert row.status.value == "unavailable"
    assert row.reason == "toylib is not installed; run `werk backends install toy`"


def _frames() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "werk_companion_frames", frames_dir() / "werk_companion_frames.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PIECES = {1: "Hel", 2: "lo", 3: " wor", 4: "ld", 5: "\xe2", 6: "\x82\xac", 9: "<end>"}


def _decode(ids: list[int]) -> str:
    """A byte-level decode: token 5 and 6 are the two halves of the UTF-8 of '€'."""
    raw = "".join(PIECES[i] for i in ids).encode("latin-1")
    return raw.decode("utf-8", errors="replace")


def test_generated_text_holds_back_stop_strings_and_half_characters() -> None:
    text = _frames().GeneratedText(_decode, ["world"])
    events = list(text.follow(iter([1, 2, 5, 6, 3, 4, 1]), eos={9}, budget=10))
    assert "".join(e["text"] for e in events) == "Hello€ "
    assert all("\ufffd" not in e["text"] for e in events)  # '€' waited for its second half
    assert [i for e in events for i in e["ids"]] == [1, 2, 5, 6, 3, 4]
    assert text.finish == "stop" and text.stopped


def test_generated_text_ends_at_eos_or_budget() -> None:
    frames = _frames()
    at_eos = frames.GeneratedText(_decode, [])
    assert "".join(e["text"] for e in at_eos.follow(iter([1, 2, 9, 3]), {9}, 10)) == "Hello"
    assert at_eos.finish == "stop" and at_eos.ids == [1, 2]
    at_budget = frames.GeneratedText(_decode, [])
    assert "".join(e["text"] for e in at_budget.follow(iter([1, 2, 3, 4]), {9}, 3)) == "Hello wor"
    assert at_budget.finish == "length"


def test_a_chat_template_is_found_where_tokenizers_keep_it(tmp_path: Path) -> None:
    frames = _frames()
    assert not frames.has_chat_template(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    assert frames.has_chat_template(str(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    (other / "chat_template.jinja").write_text("{{ messages }}")
    assert frames.has_chat_template(str(other))
    assert os.path.isdir(other)
