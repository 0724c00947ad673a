"""``werk.supervise`` with tiny real child programs (``sh``, ``sleep``, ``python -c``).

Spawn in its own process group with a log; exit noticed by the event loop and reported once;
the whole group stopped (a helper that ignores SIGTERM too); the rest of the group killed when
the leader exits; parent-death signalling through the exec shim (the spawning process is
SIGKILLed, the child dies with it); readiness with a deadline and early-exit detection; work
directories that a dead owner left behind are swept.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import psutil
import pytest

import werk
import werk.supervise
from werk import ProcessExited, SupervisedProcess, WorkDir, sweep_stale_workdirs, wait_until_ready

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process API")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not _alive(pid)


def _group(pgid: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and _alive(proc.pid):
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


@pytest.mark.anyio
async def test_spawn_logs_runs_in_its_own_group_and_reports_its_exit(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = SupervisedProcess.spawn(["sh", "-c", "echo hello; echo oops >&2; exit 3"], log_path=log)
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)  # its own process group
    codes: list[int] = []
    child.on_exit(codes.append)
    assert child.watch()  # a pidfd on the running loop: no polling needed
    with anyio.fail_after(10):
        while not codes:
            await anyio.sleep(0.01)
    assert codes == [3] and child.returncode == 3
    assert child.log_tail() == "hello\noops\n"
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    late: list[int] = []
    child.on_exit(late.append)  # registered after the exit: called at once, once
    assert late == [3] and codes == [3]


def test_a_stdio_worker_talks_over_pipes_and_logs_only_stderr(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    program = "import sys\nfor line in sys.stdin:\n print(line.strip().upper(), flush=True)\n"
    program += " print('note', file=sys.stderr, flush=True)\n"
    child = SupervisedProcess.spawn([sys.executable, "-c", program], log_path=log, stdio=True)
    assert child.popen.stdin is not None and child.popen.stdout is not None
    child.popen.stdin.write(b"ping\n")
    assert child.popen.stdout.readline() == b"PING\n"
    child.popen.stdin.close()
    assert child.popen.stdout.read() == b""  # the worker ended its output
    child.popen.stdout.close()
    assert child.popen.wait(timeout=10) == 0
    assert child.log_tail() == "note\n"


@pytest.mark.anyio
async def test_terminate_stops_the_whole_group_even_a_helper_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    script = "(trap '' TERM; sleep 60) & sleep 60"
    child = SupervisedProcess.spawn(["sh", "-c", script], log_path=tmp_path / "log")
    with anyio.fail_after(10):
        while len(_group(child.pid)) < 3:  # sh, the helper subshell, sleeps
            await anyio.sleep(0.02)
    members = _group(child.pid)
    code = await child.terminate(grace=1.0)
    assert code == -signal.SIGTERM
    assert all(_wait_gone(pid, 5) for pid in members), _group(child.pid)


@pytest.mark.anyio
async def test_a_leader_that_exits_takes_its_group_along(tmp_path: Path) -> None:
    child = SupervisedProcess.spawn(
        ["sh", "-c", "sleep 60 & echo $! > helper; sleep 0.3"],
        log_path=tmp_path / "log",
        cwd=tmp_path,
    )
    helper_file = tmp_path / "helper"
    with anyio.fail_after(10):
        while not (helper_file.exists() and helper_file.read_text().strip()):
            await anyio.sleep(0.02)
    helper = int(helper_file.read_text())
    assert _alive(helper)
    with anyio.fail_after(10):
        while child.poll() is None:
            await anyio.sleep(0.02)
    assert _wait_gone(helper, 5), "the leader's helper outlived it"


@pytest.mark.parametrize("launcher", ["setpriv", "python shim"])
def test_the_child_dies_with_the_process_that_spawned_it(tmp_path: Path, launcher: str) -> None:
    """Parent-death signalling through either launcher (``setpriv`` + ``sh``, or the Python
    exec shim where there is no ``setpriv``): SIGKILL the spawner, the child goes."""
    if launcher == "setpriv" and werk.supervise.setpriv_executable() is None:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    pidfile = tmp_path / "child.pid"
    spawner = textwrap.dedent(
        f"""
        import pathlib, time
        import werk.supervise
        from werk.supervise import SupervisedProcess
        if {launcher == "python shim"}:
            werk.supervise.setpriv_executable = lambda: None
        log = pathlib.Path({str(tmp_path / "log")!r})
        child = SupervisedProcess.spawn(["sleep", "60"], log_path=log)
        pathlib.Path({str(pidfile)!r}).write_text(str(child.pid))
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", spawner])
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        child_pid = int(pidfile.read_text())
        deadline = time.monotonic() + 10  # the shim execs sleep: wait for the exec
        while psutil.Process(child_pid).name() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert psutil.Process(child_pid).name() == "sleep"
        proc.kill()
        proc.wait()
        assert _wait_gone(child_pid, 10), "the child outlived its SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_setpriv_launcher_runs_nothing_when_its_parent_is_not_the_spawner(
    tmp_path: Path,
) -> None:
    """The ``sh`` step checks its parent like the Python shim does. Told a spawner pid that is
    not its parent (as when the spawner died before the parent-death signal was set and the
    launcher was reparented), it exits 1 without running the program; told the right one, it
    runs it. A guarded group still gets the Python shim."""
    setpriv = werk.supervise.setpriv_executable()
    if setpriv is None:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    marker = tmp_path / "ran"
    launcher = werk.supervise._launcher("/bin/touch", guard_group=False)
    assert launcher[0] == setpriv
    ours = subprocess.run([*launcher, "/bin/touch", str(marker)])
    assert ours.returncode == 0 and marker.exists()
    marker.unlink()
    stranger = [*launcher[:-1], "1", "/bin/touch", str(marker)]  # pid 1 spawned it, it says
    assert subprocess.run(stranger).returncode == 1
    assert not marker.exists()
    assert werk.supervise._launcher("/bin/touch", guard_group=True)[0] == sys.executable


def test_a_program_that_cannot_be_executed_exits_127_with_a_reason(tmp_path: Path) -> None:
    child = SupervisedProcess.spawn([str(tmp_path / "missing")], log_path=tmp_path / "log")
    assert child.popen.wait(timeout=30) == 127
    assert "cannot execute" in child.log_tail()


@pytest.mark.anyio
async def test_wait_until_ready_sees_readiness_an_early_exit_and_the_deadline(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "ready"
    child = SupervisedProcess.spawn(
        ["sh", "-c", f"sleep 0.2; touch {flag}; sleep 60"], log_path=tmp_path / "a.log"
    )

    async def ready() -> bool:
        return flag.exists()

    try:
        await wait_until_ready(child, ready, timeout=20, what="the test child")
    finally:
        await child.terminate()

    quitter = SupervisedProcess.spawn(["sh", "-c", "exit 7"], log_path=tmp_path / "b.log")
    with pytest.raises(ProcessExited) as exited:
        await wait_until_ready(quitter, ready_never, timeout=20)
    assert exited.value.code == 7

    slow = SupervisedProcess.spawn(["sleep", "60"], log_path=tmp_path / "c.log")
    try:
        with pytest.raises(werk.WerkTimeout, match="slow thing did not become ready within 0s"):
            await wait_until_ready(slow, ready_never, timeout=0.3, what="slow thing")
        assert slow.poll() is None  # the caller decides whether to stop it
    finally:
        await slow.terminate()


async def ready_never() -> bool:
    return False


def test_work_dirs_are_private_locked_and_swept_only_when_their_owner_is_gone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "backend"
    live = WorkDir.create(root, "g_live", subdirs=("slots",))
    assert oct(live.path.stat().st_mode & 0o777) == "0o700"
    assert oct((live.path / "slots").stat().st_mode & 0o777) == "0o700"
    # A directory whose lock nobody holds (its Werk was SIGKILLed) ...
    stale = root / "g_dead"
    stale.mkdir(mode=0o700)
    (stale / "lock").write_text("")
    assert sweep_stale_workdirs(root) == ["g_dead"]
    assert not stale.exists() and live.path.exists()  # ... goes; the held one stays
    fd = os.open(live.path / "lock", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    live.release()
    live.release()  # idempotent
    assert not live.path.exists()


def test_a_guarded_group_dies_with_its_spawner_helpers_included(tmp_path: Path) -> None:
    """``guard_group``: a program that starts helpers of its own (vLLM's engine) leaves none
    behind when the spawning process is SIGKILLed (the helpers have no parent-death signal)."""
    helper_file = tmp_path / "helper"
    spawner = textwrap.dedent(
        f"""
        import pathlib, time
        from werk.supervise import SupervisedProcess
        log = pathlib.Path({str(tmp_path / "log")!r})
        script = "sleep 60 & echo $! > {helper_file}; sleep 60"
        child = SupervisedProcess.spawn(["sh", "-c", script], log_path=log, guard_group=True)
        pathlib.Path({str(tmp_path / "pid")!r}).write_text(str(child.pid))
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", spawner])
    try:
        deadline = time.monotonic() + 30
        while not (helper_file.exists() and helper_file.read_text().strip()):
            assert time.monotonic() < deadline, "the helper never started"
            time.sleep(0.02)
        guardian = int((tmp_path / "pid").read_text())
        helper = int(helper_file.read_text())
        group = _group(guardian)
        assert helper in group and len(group) >= 3  # guardian, sh, the helper sleep
        proc.kill()
        proc.wait()
        assert all(_wait_gone(pid, 10) for pid in group), _group(guardian)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.anyio
async def test_a_guarded_program_reports_its_own_exit_status(tmp_path: Path) -> None:
    child = SupervisedProcess.spawn(
        ["sh", "-c", "echo from the program; exit 5"], log_path=tmp_path / "log", guard_group=True
    )
    with anyio.fail_after(30):
        while child.poll() is None:
            await anyio.sleep(0.02)
    assert child.returncode == 5
    assert child.log_tail() == "from the program\n"
    sleeper = SupervisedProcess.spawn(["sleep", "60"], log_path=tmp_path / "s", guard_group=True)
    with anyio.fail_after(30):  # the guardian is up and has started the program
        while len(_group(sleeper.pid)) < 2:
            await anyio.sleep(0.02)
    assert await sleeper.terminate(grace=5) == 128 + signal.SIGTERM  # graceful: via the program


def _group_leader(script: str) -> tuple[subprocess.Popen[bytes], int]:
    """A shell leading its own group that starts a TERM-ignoring helper and prints its pid."""
    leader = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, start_new_session=True)
    assert leader.stdout is not None
    with leader.stdout:
        helper = int(leader.stdout.readline())
    return leader, helper


def test_stop_group_kills_a_leader_that_ignores_sigterm_and_its_helpers() -> None:
    from werk.supervise import stop_group

    leader, helper = _group_leader("trap '' TERM; sleep 300 & echo $!; wait")
    started = time.monotonic()
    assert stop_group(leader, grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10
    _gone(helper)


def _gone(pid: int) -> None:
    """``pid`` ends (or is a zombie awaiting its reaper) within 5 s: SIGKILL is asynchronous."""
    deadline = time.monotonic() + 5
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        assert time.monotonic() < deadline, f"process {pid} outlived its group"
        time.sleep(0.02)


def test_stop_group_also_stops_helpers_that_outlive_a_leader_that_obeyed() -> None:
    from werk.supervise import stop_group

    leader, helper = _group_leader("sh -c \"trap '' TERM; sleep 300\" & echo $!; sleep 300")
    assert stop_group(leader, grace=5) == -signal.SIGTERM
    _gone(helper)
    assert stop_group(leader) == -signal.SIGTERM  # idempotent


@pytest.mark.anyio
async def test_stop_requests_at_varied_moments_of_a_guarded_start_are_honoured(
    tmp_path: Path,
) -> None:
    """SIGTERM that reaches a guarded process while it is starting (before the guardian forks,
    or while the child is still the shim) stops it: the shim blocks SIGTERM across the fork and
    passes a pending one on, so the guardian never waits out its grace for a program that
    missed the request."""
    for attempt in range(20):
        sleeper = SupervisedProcess.spawn(
            ["sleep", "60"], log_path=tmp_path / f"s{attempt}", guard_group=True
        )
        await anyio.sleep(attempt * 0.002)  # land in a different moment of the start each time
        started = time.monotonic()
        code = await sleeper.terminate(grace=5)
        assert code != -signal.SIGKILL, f"attempt {attempt}: the stop request was lost"
        assert code in (128 + signal.SIGTERM, -signal.SIGTERM), (attempt, code)
        assert time.monotonic() - started < 5


def test_a_child_api_key_is_an_argparse_value_even_when_its_random_part_starts_with_a_dash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM's argparse once read ``--api-key -Xyz…`` as a missing value (1 start in 64)."""
    import argparse
    import secrets

    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--api-key")
    keys = {werk.child_api_key() for _ in range(200)}
    assert len(keys) == 200
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=None: "-" + "A" * 42)
    keys.add(werk.child_api_key())
    for key in keys:
        assert parser.parse_args(["--api-key", key]).api_key == key
        assert len(key) >= 40
