"""``werk serve --loop``: uvloop by default where it is installed, Python's loop on request."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from werk.cli.serve import EventLoop, event_loop_options
from werk.testing.server import WERK, server_env, werk_serve


def test_auto_is_uvloop_where_it_is_installed() -> None:
    assert importlib.util.find_spec("uvloop") is not None  # a dependency outside Windows
    assert event_loop_options(EventLoop.AUTO) == {"use_uvloop": True}
    assert event_loop_options(EventLoop.UVLOOP) == {"use_uvloop": True}
    assert event_loop_options(EventLoop.ASYNCIO) == {"use_uvloop": False}


def test_without_uvloop_auto_falls_back_and_an_explicit_uvloop_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert event_loop_options(EventLoop.AUTO) == {"use_uvloop": False}
    with pytest.raises(typer.BadParameter, match="--loop asyncio"):
        event_loop_options(EventLoop.UVLOOP)


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/maps")
@pytest.mark.parametrize(("args", "uvloop"), [((), True), (("--loop", "asyncio"), False)])
def test_the_server_runs_on_the_chosen_loop(
    tmp_path: Path, testkv_site: Path, args: tuple[str, ...], uvloop: bool
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with werk_serve(home, testkv_site, args) as server, server.client() as http:
        assert http.get("/v1/models").status_code == 200
        loaded = "/uvloop/loop." in _maps(server.process.pid)
    assert loaded is uvloop


def test_an_unknown_loop_is_a_usage_error(werk_home: Path, testkv_site: Path) -> None:
    done = subprocess.run(
        [str(WERK), "serve", "--loop", "trio"],
        env=server_env(werk_home, testkv_site),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--loop" in done.stderr and "serving on" not in done.stderr
