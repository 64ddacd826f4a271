"""The smallest Python relay, the yardstick of `python -m bench ceiling`: a bare ASGI function under uvicorn (uvloop,
httptools) that forwards every request with one shared aiohttp session and relays body chunks as they come.

`python -m bench.relay --upstream http://127.0.0.1:9000 --port 9001`
"""

from __future__ import annotations

import argparse

import aiohttp
import uvicorn

from bench.instant import App, Receive, Scope, Send

HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


def create(upstream: str) -> App:
    sessions: list[aiohttp.ClientSession] = []  # one, made inside the server's loop at start-up

    async def relay(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False))
                await send({"type": "lifespan.startup.complete"})
            await sessions[0].close()
            return await send({"type": "lifespan.shutdown.complete"})
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k.decode() not in HOP}
        url = upstream + scope["raw_path"].decode() + ("?" + q.decode() if (q := scope["query_string"]) else "")
        async with sessions[0].request(scope["method"], url, data=body, headers=headers) as answer:
            out = [(k, v) for k, v in answer.raw_headers if k.decode().lower() not in HOP - {"content-length"}]
            await send({"type": "http.response.start", "status": answer.status, "headers": out})
            async for chunk in answer.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return relay


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = create(args.upstream.rstrip("/"))
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", backlog=4096,
                access_log=False, log_level="warning", server_header=False, date_header=False)  # fmt: skip


if __name__ == "__main__":
    main()
