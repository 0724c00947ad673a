"""``werk serve`` on a port another process listens on: one clear error, nothing claims to serve."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from werk.testing.server import WERK, server_env


def test_a_port_in_use_is_one_clear_error_naming_the_port_and_its_holder(
    werk_home: Path, testkv_site: Path
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [str(WERK), "serve", "--port", str(port)],
            env=server_env(werk_home, testkv_site),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "--port N" in done.stderr and "make serve PORT=N" in done.stderr
    assert f"(pid {os.getpid()})" in done.stderr  # this test process holds it
    assert "serving on" not in done.stderr and "Traceback" not in done.stderr
