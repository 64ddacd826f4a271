"""Run an ASGI app with uvicorn on a pre-bound loopback socket, in this event loop or in a thread of its own.

The demo runs the simulator and the guard side by side in one loop; tests use the thread form so that a plain
synchronous client (the OpenAI SDK's `OpenAI`) can talk to the servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import threading
import time
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import uvicorn

from proxy.server.protocol import ConnectionLimits, protocol_factory
from proxy.settings import ServerSettings


def bind_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio sets TCP_NODELAY only for TCP
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def uvicorn_options(server: ServerSettings) -> dict[str, Any]:
    """How uvicorn serves the guard: uvloop and httptools, with the guard's limits on request headers and on clients
    that stop reading (protocol.py: given with the protocol's factory, which uvicorn's config carries into worker
    processes too), no access log of its own (the guard logs one line per request), no rewriting of the client
    address and scheme from X-Forwarded-* headers (nothing in the guard reads either: it was one more ASGI layer and
    header scan on every request), and on SIGTERM it stops accepting and lets requests in flight finish for up to
    server.drain_timeout_s, then cancels those left (app.py ends each as its protocol expects)."""
    limits = ConnectionLimits(header_timeout_s=server.read_timeout_s, write_timeout_s=server.write_timeout_s)
    return {
        "loop": "uvloop",
        "http": protocol_factory(limits),
        "access_log": False,
        "proxy_headers": False,
        "backlog": 4096,
        "timeout_graceful_shutdown": server.drain_timeout_s,
    }


def freeze_heap() -> None:
    """Call once the app is built, in a process that serves it. What start-up built (imported modules, tokenizers,
    templates: some 100,000 objects) lives as long as the process; frozen, the collector no longer walks it all on
    each of its full passes (~60 ms each, every few thousand requests: a tenth of a millisecond per request). The
    thresholds stay Python's: raised, cyclic garbage (the tracebacks of clients that left) lingers long enough for the
    soak test to take it for a leak."""
    gc.collect()
    gc.freeze()


def make_server(app: Any, *, log_level: str = "warning", **options: Any) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", **options)
    return uvicorn.Server(config)


@contextlib.asynccontextmanager
async def running(app: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> AsyncIterator[str]:
    """Serve `app` until the block exits; yields its base URL (http://host:port)."""
    sock = bind_socket(host, port)
    server = make_server(app, **options)
    server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
    try:
        async with asyncio.TaskGroup() as group:
            serving = group.create_task(server.serve(sockets=[sock]))
            try:
                while not server.started:
                    if serving.done():
                        raise RuntimeError("server stopped during start-up")
                    await asyncio.sleep(0.01)
                bound_host, bound_port = sock.getsockname()[:2]
                yield f"http://{bound_host}:{bound_port}"
            finally:
                server.should_exit = True
    finally:
        sock.close()


class ServerThread:
    """`running()` in a thread with its own event loop, for synchronous callers (tests, scripts)."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, **options: Any) -> None:
        self.app = app
        self._app, self._host, self._port, self._options = app, host, port, options
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="server-thread", daemon=True)
        self.url = ""

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced to the starting thread
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with running(self._app, self._host, self._port, **self._options) as url:
            self.url = url
            self._ready.set()
            await self._stop.wait()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(timeout=60)
        if self._error is not None:
            raise RuntimeError(f"server failed to start: {self._error!r}") from self._error
        if not self.url:
            raise RuntimeError("server did not start within 60 s")
        return self

    def hold(self, seconds: float) -> None:
        """Keep the server's event loop busy for `seconds` from now, as a burst of work would (what arrives meanwhile
        is handled all in the next turns); returns once the hold has begun."""
        if self._loop is None:
            raise RuntimeError("the server is not running")
        begun = threading.Event()

        def busy() -> None:
            begun.set()
            time.sleep(seconds)

        self._loop.call_soon_threadsafe(busy)
        begun.wait(timeout=60)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
