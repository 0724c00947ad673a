"""``werk run`` stops and reaps the runtime it started when it is interrupted.

The ``standin`` backend stands for a Werk-managed llama-server: its runtime owns a real child
process (``sleep 600``, in its own session so no signal sent to ``werk`` reaches it directly)
that only the backend's ``stop`` terminates and reaps. After each interruption the child must
not exist at all (not even as a zombie) and ``stop`` must have recorded its exit, whether the
signal came while a reply was streaming or while the model was still "loading" in ``start``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _chat_support import (
    HANG_GUARD,
    WERK,
    cli_env,
    import_model,
    marker,
    ok,
    process_gone,
    read_until,
    werk,
)


def _spawn(home: Path, site: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(WERK), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(home, site),
        start_new_session=True,  # our signals go to werk alone, never to its children
    )


def _wait_for_file(path: Path, proc: subprocess.Popen[bytes]) -> None:
    guard = time.monotonic() + HANG_GUARD
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"werk exited {proc.returncode} before {path.name} appeared")
        if time.monotonic() > guard:
            proc.kill()
            pytest.fail(f"{path.name} did not appear")
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_during_a_reply_stops_and_reaps(
    home: Path, plugin_site: Path, sig: signal.Signals
) -> None:
    model_file = import_model(home, plugin_site, "sm", "standin", "stand-in model\n")
    proc = _spawn(home, plugin_site, "run", "sm", "wait <<hang>>")
    try:
        assert proc.stdout is not None
        read_until(proc.stdout.fileno(), b"partial", bytearray(), proc)  # the reply is streaming
        child = int(marker(model_file, ".pid").read_text())
        assert not process_gone(child)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig, err.decode()
    assert b"everything this command started was stopped" in err
    assert b"Traceback" not in err
    stopped_pid, _code = marker(model_file, ".stopped").read_text().split()
    assert stopped_pid == str(child)
    assert process_gone(child)


def test_sigterm_while_the_model_loads_cancels_the_start(home: Path, plugin_site: Path) -> None:
    model_file = import_model(home, plugin_site, "slow", "standin", "model\nstart-delay: 120\n")
    proc = _spawn(home, plugin_site, "run", "slow", "hello")
    try:
        _wait_for_file(marker(model_file, ".pid"), proc)  # child spawned, start still blocked
        child = int(marker(model_file, ".pid").read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=HANG_GUARD)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert marker(model_file, ".start-cancelled").read_text() == str(child)
    assert process_gone(child)


def test_normal_completion_stops_the_runtime(home: Path, plugin_site: Path) -> None:
    model_file = import_model(home, plugin_site, "sm", "standin", "stand-in model\n")
    proc = ok(werk(home, plugin_site, "run", "sm", "-v", "a b c"))
    assert proc.stdout == "standin: c b a\n"
    child = int(marker(model_file, ".pid").read_text())
    assert marker(model_file, ".stopped").read_text().split()[0] == str(child)
    assert process_gone(child)
    phases = proc.stderr
    assert "runtime: ready" in phases and "runtime: stopped" in phases
    assert phases.index("runtime: ready") < phases.index("runtime: stopped")


@pytest.mark.parametrize(("mode", "phase"), [("on", "released for 1 of 1"), ("off", None)])
def test_the_model_file_cache_is_released_after_the_runtime_stopped(
    home: Path, plugin_site: Path, mode: str, phase: str | None
) -> None:
    """``werk run`` holds a lease on the model file while its runtime runs and, with
    ``WERK_MODEL_CACHE_RELEASE=on``, releases its page cache after the stop (mincore)."""
    from werk.memory.pages import resident_pages

    model_file = import_model(home, plugin_site, "sm", "standin", "stand-in model\n" * 2048)
    model_file.read_bytes()  # in the page cache, as the backend's reads would leave it
    os.sync()
    env = {"WERK_MODEL_CACHE_RELEASE": mode}
    proc = ok(werk(home, plugin_site, "run", "sm", "-v", "a b c", **env))
    phases = proc.stderr
    after = resident_pages(model_file)
    if phase is None:
        assert "model file cache" not in phases
        assert after.resident == after.total
    else:
        assert f"model file cache: {phase} file(s)" in phases
        assert phases.index("runtime: stopped") < phases.index("model file cache")
        assert after.resident == 0
