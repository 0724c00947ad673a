"""The least a Python HTTP relay does: a control for relay benchmarks.

uvicorn with its ``httptools`` parser on the loop ``werk serve`` uses (uvloop where installed),
a bare ASGI app and the host's pooled :class:`werk.LoopbackClient`: it reads the request body,
POSTs it unchanged to the same path upstream (once more on a new connection when a pooled one
turns out closed, as any pooled relay must) and answers the upstream's status and body. No
routing, authentication, request ids, metrics, access log, runtime accounting, slot choice or
JSON. What a throughput comparison shows for it against the direct server is what any relay
built on this stack pays on this machine; Werk's relay does all the things this one leaves out
on the same stack. Non-streamed requests only (a streamed reply arrives whole at the end).

Run: ``python benchmarks/minimal_relay.py LISTEN_PORT UPSTREAM_PORT [API_KEY]`` (127.0.0.1;
``API_KEY`` is sent upstream as ``Authorization: Bearer``).
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

import uvicorn

from werk import LoopbackClient, NotSent

MAX_BODY = 64 * 1024 * 1024


def make_app(upstream: int, key: str | None) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    clients: list[LoopbackClient] = []  # made on the serving loop, on the first request

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
        try:
            response = await clients[0].request(scope["method"], scope["path"], body=body)
        except NotSent:  # a pooled connection the server had closed (its keep-alive timeout)
            response = await clients[0].request(
                scope["method"], scope["path"], body=body, fresh=True
            )
        try:
            answer = await response.read(MAX_BODY)
        finally:
            await response.aclose()
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


def main(argv: list[str]) -> None:
    listen, upstream = int(argv[0]), int(argv[1])
    key = argv[2] if len(argv) > 2 else None
    loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    uvicorn.run(
        make_app(upstream, key),
        host="127.0.0.1",
        port=listen,
        http="httptools",
        loop=loop,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
