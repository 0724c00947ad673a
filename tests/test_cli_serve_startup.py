"""``werk serve``'s start-up sequence (``werk.cli.serve._serve``) with stand-ins for the service
and the HTTP server: the preload starts first, the HTTP stack is built in a worker thread with a
short thread switch interval, and the interval is restored whatever happens."""

from __future__ import annotations

import signal
import sys
from typing import Any

import anyio
import pytest

from werk.cli.serve import STARTUP_SWITCH_INTERVAL, _serve


class Service:
    def __init__(self) -> None:
        self.events: list[str] = []

    async def preload(self) -> None:
        self.events.append("preload")

    async def aclose(self) -> None:
        self.events.append("aclose")


class Server:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def handle_exit(self, sig: Any, frame: Any) -> None:  # the SIGHUP handler's target
        pass

    async def serve(self) -> None:
        self.events.append(f"serve at {sys.getswitchinterval()}")


@pytest.mark.parametrize("fails", [False, True])
def test_the_http_stack_is_built_with_a_short_switch_interval_then_restored(fails: bool) -> None:
    before = sys.getswitchinterval()
    service = Service()
    hup = signal.getsignal(signal.SIGHUP)

    def http_server() -> Server:
        service.events.append(f"build at {sys.getswitchinterval()}")
        if fails:
            raise RuntimeError("the port is taken")
        return Server(service.events)

    try:
        if fails:
            with pytest.raises(RuntimeError, match="port"):
                anyio.run(_serve, service, http_server)
        else:
            anyio.run(_serve, service, http_server)
    finally:
        signal.signal(signal.SIGHUP, hup)  # _serve installs its own
    assert sys.getswitchinterval() == before
    assert f"build at {STARTUP_SWITCH_INTERVAL}" in service.events
    assert "preload" in service.events and service.events[-1] == "aclose"
    if not fails:
        assert f"serve at {before}" in service.events
