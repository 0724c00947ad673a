"""The loopback hop alone: httpx vs asyncio streams vs ``werk.LoopbackClient``.

A trivial starlette app under uvicorn (in a child process, as Werk's server runs) answers a small
JSON POST; one keep-alive connection per client sends ``--requests`` requests in a row, the three
clients taking turns in blocks (``--rounds`` blocks each). Medians per request are printed. The
asyncio-streams client is hand-written HTTP/1.1 with no pooling or checks: the floor any client on
asyncio pays. What is left between it and the server is the server's own time.

Run: ``.venv/bin/python benchmarks/loopback_client.py [--requests 1500] [--rounds 2]``.
Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
from llamacpp_proxy_overhead import free_port

from werk import LoopbackClient
from werk.supervise import stop_group

BODY = b'{"model": "demo", "messages": [{"role": "user", "content": "Say hi."}]}'
SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

async def answer(request):
    await request.body()
    return Response(b'{"ok": true}', media_type="application/json")

app = Starlette(routes=[Route("/x", answer, methods=["POST"])])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False)
"""


async def measure(port: int, requests: int, rounds: int) -> dict[str, float]:
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}")
    loopback = LoopbackClient("127.0.0.1", port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def streams() -> bytes:
        writer.write(
            b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
        )
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return await reader.readexactly(length)

    async def werk_loopback() -> bytes:
        async with await loopback.request("POST", "/x", body=BODY) as response:
            return await response.read(1 << 20)

    async def with_httpx() -> bytes:
        return (await http.post("/x", content=BODY)).content

    clients: dict[str, Callable[[], Awaitable[bytes]]] = {
        "httpx.AsyncClient": with_httpx,
        "asyncio streams (floor)": streams,
        "werk.LoopbackClient": werk_loopback,
    }
    samples: dict[str, list[float]] = {name: [] for name in clients}
    for _ in range(rounds):
        for name, send in clients.items():
            for i in range(requests):
                start = time.perf_counter()
                await send()
                if i >= requests // 10:  # the first tenth of each block warms up
                    samples[name].append(time.perf_counter() - start)
    writer.close()
    await http.aclose()
    await loopback.aclose()
    return {name: statistics.median(values) for name, values in samples.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.post(f"http://127.0.0.1:{port}/x", content=BODY, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the test server did not start") from None
                time.sleep(0.05)
        medians = asyncio.run(measure(port, args.requests, args.rounds))
    finally:
        stop_group(server)
    print(f"median per request, {args.rounds} x {args.requests} requests per client")
    for name, seconds in medians.items():
        print(f"  {name:<24} {seconds * 1e3:6.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
