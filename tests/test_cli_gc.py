"""The garbage collector paused while a ``werk`` command starts (:mod:`werk.cli._gc`)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import run_script

from werk.cli import _gc


@pytest.fixture
def collector() -> Iterator[None]:
    """Whatever a test does to the collector is undone afterwards."""
    yield
    _gc._paused = False
    gc.unfreeze()
    gc.enable()


def test_resume_freezes_what_start_up_built_and_lets_the_collector_run(collector: None) -> None:
    _gc.pause()
    assert not gc.isenabled()
    built = [{"start-up": i} for i in range(100)]  # tracked objects, alive at resume
    frozen = gc.get_freeze_count()
    _gc.resume()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(built)
    again = gc.get_freeze_count()
    _gc.resume()  # idempotent: nothing frozen twice
    assert gc.get_freeze_count() == again


def test_a_collector_someone_else_stopped_stays_stopped(collector: None) -> None:
    gc.disable()
    frozen = gc.get_freeze_count()
    _gc.pause()
    _gc.resume()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == frozen


COMMAND_GC = (
    "import atexit, gc, sys\n"
    "atexit.register(lambda: print('GC', gc.isenabled(), gc.get_freeze_count() > 0,"
    " file=sys.stderr))\n"
    "sys.argv[0] = 'werk'\n"
    "from werk.cli import main\n"
    "main()\n"
)

SERVE_GC = (
    "import gc, os, signal, sys, threading, time\n"
    "def watch():\n"
    "    deadline, paused = time.monotonic() + 60, False\n"
    "    while time.monotonic() < deadline:\n"
    "        if not gc.isenabled():\n"
    "            paused = True\n"
    "        elif paused:\n"
    "            break\n"
    "        time.sleep(0.001)\n"
    "    print('GC', paused, gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr,"
    " flush=True)\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "threading.Thread(target=watch, daemon=True).start()\n"
    "sys.argv[0] = 'werk'\n"
    "from werk.cli import main\n"
    "main()\n"
)


def _gc_line(stderr: str) -> list[str]:
    lines = [line.split()[1:] for line in stderr.splitlines() if line.startswith("GC ")]
    assert lines, stderr
    return lines[-1]


def test_a_command_runs_with_the_collector_resumed(werk_home: Path) -> None:
    """``werk models list`` through ``werk.cli.main``: by the time it ran, start-up was frozen
    and the collector runs again."""
    done = run_script(COMMAND_GC, "models", "list", home=werk_home)
    assert done.returncode == 0, done.stderr
    assert _gc_line(done.stderr) == ["True", "True"]


def test_serve_resumes_the_collector_once_it_has_started(werk_home: Path) -> None:
    """``werk serve`` starts with the collector paused and resumes it (start-up frozen) once its
    HTTP stack is up; the watcher then stops it with SIGINT."""
    done = run_script(SERVE_GC, "serve", "--port", "0", home=werk_home)
    assert done.returncode in (0, 130), done.stderr  # 130: uvicorn re-raises the SIGINT
    assert _gc_line(done.stderr) == ["True", "True", "True"]
