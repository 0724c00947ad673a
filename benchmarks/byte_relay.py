"""A byte-for-byte TCP relay: the cheapest hop there is, as a control for relay benchmarks.

It parses nothing (no HTTP), so whatever a throughput comparison shows for it against the
direct server is that comparison's own spread on this machine, not a relay's cost. One
upstream connection per client connection, closed with it.

Run: ``python benchmarks/byte_relay.py LISTEN_PORT UPSTREAM_PORT`` (both on 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def _serve(listen: int, upstream: int) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(relay, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2])))
