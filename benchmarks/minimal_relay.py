"""The least a Python HTTP relay does: a control for relay benchmarks.

uvicorn with its ``httptools`` parser on the loop ``werk serve`` uses (uvloop where installed),
a bare ASGI app and the host's pooled :class:`werk.LoopbackClient`: it reads the request body,
POSTs it unchanged to the same path upstream (once more on a new connection when a pooled one
turns out closed, as any pooled relay must) and answers the upstream's status and body. No
routing, authentication, request ids, metrics, access log, runtime accounting, slot choice or
JSON. What a throughput comparison shows for it against the direct server is what any relay
built on this stack pays on this machine; Werk's relay does all the things this one leaves out
on the same stack. Non-streamed requests only (a streamed reply arrives whole at the end).

``--pin-slots 0,1,2,3`` (llama-server only): the body is decoded, given ``"cache_prompt": true``
and the ``id_slot`` of the least busy of those slots (the lowest on a tie), and encoded again,
as Werk's llama.cpp relay pins each request to a general slot and keeps the state slot free.
Its ratio to the same relay without ``--pin-slots`` is what pinning costs a relay that does
nothing else (its ratio to direct also holds the hop itself).

``--burn-us N`` spends N microseconds of CPU (a busy loop on the thread's own CPU clock) and
``--sleep-us N`` waits N microseconds without CPU (``asyncio.sleep``) before each request goes
upstream: a relay that costs a known amount more, which ``benchmarks/relay_cost.py`` measures
beside Werk's relay (whether req/s can tell such a cost apart at all on this machine).

Run: ``python benchmarks/minimal_relay.py LISTEN_PORT UPSTREAM_PORT [API_KEY] [--pin-slots
S,S,...] [--burn-us N] [--sleep-us N]`` (127.0.0.1; ``API_KEY`` is sent upstream as
``Authorization: Bearer``).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import uvicorn

from werk import LoopbackClient, LoopbackResponse, NotSent

MAX_BODY = 64 * 1024 * 1024


def make_app(
    upstream: int,
    key: str | None,
    pin_slots: Sequence[int] = (),
    *,
    burn: float = 0.0,
    sleep: float = 0.0,
) -> Any:
    """The relay's ASGI app; ``burn`` and ``sleep`` (seconds) are spent on every request."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    clients: list[LoopbackClient] = []  # made on the serving loop, on the first request
    busy = dict.fromkeys(pin_slots, 0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if not clients:
            clients.append(LoopbackClient("127.0.0.1", upstream, headers=headers))
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        slot = None
        if busy:
            slot = min(busy, key=busy.__getitem__)
            busy[slot] += 1
            request = msgspec.json.decode(body)
            request["cache_prompt"] = True
            request["id_slot"] = slot
            body = msgspec.json.encode(request)
        if burn:
            until = time.thread_time() + burn
            while time.thread_time() < until:
                pass
        if sleep:
            await asyncio.sleep(sleep)
        try:
            answer, response = await _exchange(clients[0], scope, body)
        finally:
            if slot is not None:
                busy[slot] -= 1
        await send(
            {
                "type": "http.response.start",
                "status": response.status,
                "headers": [
                    (b"content-type", response.content_type.encode()),
                    (b"content-length", str(len(answer)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


async def _exchange(
    client: LoopbackClient, scope: dict[str, Any], body: bytes
) -> tuple[bytes, LoopbackResponse]:
    try:
        response = await client.request(scope["method"], scope["path"], body=body)
    except NotSent:  # a pooled connection the server had closed (its keep-alive timeout)
        response = await client.request(scope["method"], scope["path"], body=body, fresh=True)
    try:
        return await response.read(MAX_BODY), response
    finally:
        await response.aclose()


def _option(argv: list[str], name: str) -> tuple[str | None, list[str]]:
    """The value after ``name`` in ``argv`` (``None`` when absent) and ``argv`` without both."""
    if name not in argv:
        return None, argv
    at = argv.index(name)
    return argv[at + 1], argv[:at] + argv[at + 2 :]


def main(argv: list[str]) -> None:
    pins, argv = _option(argv, "--pin-slots")
    burn_us, argv = _option(argv, "--burn-us")
    sleep_us, argv = _option(argv, "--sleep-us")
    pin_slots = [int(s) for s in pins.split(",")] if pins else []
    burn = float(burn_us or 0) / 1e6
    sleep = float(sleep_us or 0) / 1e6
    listen, upstream = int(argv[0]), int(argv[1])
    key = argv[2] if len(argv) > 2 else None
    loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    uvicorn.run(
        make_app(upstream, key, pin_slots, burn=burn, sleep=sleep),
        host="127.0.0.1",
        port=listen,
        http="httptools",
        loop=loop,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
