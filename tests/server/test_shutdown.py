"""SIGTERM with requests in flight: a real ``werk serve`` stops accepting, gives running requests
its grace period (``--shutdown-grace``, 10 s by default), cancels what still runs with one log
line each, stops its backends and exits; its log holds no traceback."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
from _server import import_model, werk_serve


def test_sigterm_with_requests_in_flight_exits_within_the_bound_without_a_traceback(
    werk_home: Path, testkv_site: Path
) -> None:
    words = " ".join(f"word{i}" for i in range(200))  # a long answer: 0.5 s a chunk
    import_model(werk_home, testkv_site, "kv", words)
    grace = 2.0  # --shutdown-grace: the streams below run about 5 s
    args = ["--model", "kv", "--shutdown-grace", str(grace)]
    with werk_serve(werk_home, testkv_site, args) as server:
        started = threading.Event()
        outcomes: list[str] = []

        def stream() -> None:  # 0.5 s a chunk: far longer than the grace period
            body = {"model": "kv", "stream": True, "max_tokens": 200,
                    "messages": [{"role": "user", "content": "<<slow-stream>> go"}]}  # fmt: skip
            try:
                with (
                    server.client(timeout=60) as http,
                    http.stream("POST", "/v1/chat/completions", json=body) as answer,
                ):
                    for _ in answer.iter_lines():
                        started.set()
                outcomes.append("ended")
            except httpx.HTTPError as exc:
                outcomes.append(type(exc).__name__)

        clients = [threading.Thread(target=stream) for _ in range(3)]
        for client in clients:
            client.start()
        assert started.wait(30)
        time.sleep(0.5)
        stopping = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=grace + 20)
        took = time.monotonic() - stopping
        for client in clients:
            client.join(timeout=30)
        log = server.log()
    assert took <= grace + 5, f"exit took {took:.1f} s"
    # uvicorn re-raises the signal it handled once it is done: the status of a SIGTERM.
    assert server.process.returncode in (0, -signal.SIGTERM), log[-2000:]
    assert "Traceback" not in log and "Exception in ASGI application" not in log, log[-3000:]
    assert log.count("cancelled: the server is shutting down") == 3, log[-3000:]
    assert len(outcomes) == 3  # every client got an end (a cut stream), none hangs
