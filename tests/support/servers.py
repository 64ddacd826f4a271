"""Servers for end-to-end tests: the simulator on loopback or in memory (reached through tests/support/fakehttp.py,
without a socket), the guard on loopback in front of either, and a tap that records the exact bytes the simulator
sent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.counting.registry import ModelRegistry
from proxy.server.app import GuardApp, create_app
from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import Settings, load_settings
from simulator import SimulatorSettings, SimulatorStats
from simulator import create_app as create_simulator
from tests.support.fakehttp import AsgiTransport
from tests.support.polling import eventually

MODEL = "tiny"
IN_MEMORY = "http://simulator.invalid:8000"  # the in-memory simulator's base URL: .invalid never resolves


class Tap:
    """ASGI middleware keeping the response body bytes, the path, the raw query string and the headers of every HTTP
    request, in order."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.queries: list[bytes] = []
        self.headers: list[list[tuple[bytes, bytes]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.paths.append(scope["path"])
        self.queries.append(scope["query_string"])
        self.headers.append(list(scope["headers"]))
        chunks: list[bytes] = []

        async def record(message: Message) -> None:
            if message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            self.bodies.append(b"".join(chunks))


@contextmanager
def simulator(tokenizer: Path, **options: Any) -> Iterator[tuple[ServerThread, Any, Tap]]:
    app = create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, **options))
    tap = Tap(app)
    with ServerThread(tap) as server:
        yield server, app.state.stats, tap


@dataclass
class InMemorySim:
    """The simulator without a socket: the guard reaches it through fakehttp.AsgiTransport at `url`, a test through
    `client` (a synchronous HTTP client, for asking the simulator directly; also the OpenAI SDK's `http_client`)."""

    url: str
    app: Starlette
    tap: Tap
    client: TestClient

    @property
    def stats(self) -> SimulatorStats:
        stats: SimulatorStats = self.app.state.stats
        return stats


def simulator_in_memory(tokenizer: Path, **options: Any) -> contextlib.AbstractContextManager[InMemorySim]:
    return in_memory(create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, **options)))


@contextmanager
def in_memory(app: Starlette, front: ASGIApp | None = None) -> Iterator[InMemorySim]:
    """`app` (usually a simulator) without a socket; `front`: middleware around it, which is what gets the requests."""
    tap = Tap(front or app)
    with TestClient(tap, base_url=IN_MEMORY) as client:
        yield InMemorySim(IN_MEMORY, app, tap, client)


Upstream = str | InMemorySim  # a simulator's URL on loopback, or one in memory


@contextmanager
def guard(upstream: Upstream, tokenizer: Path | None = None, **flags: Any) -> Iterator[ServerThread]:
    """The guard in front of `upstream`, once its /health says ready."""
    with _guard(upstream, tokenizer, flags) as server:
        wait_healthy(server.url)
        wait_checked(server, upstream)
        yield server


def guard_unchecked(upstream: Upstream, tokenizer: Path | None = None, **flags: Any) -> ServerThread:
    """The guard in front of an upstream that may never be healthy (a started ServerThread's context manager)."""
    return _server(upstream, tokenizer, flags)


@contextmanager
def _guard(upstream: Upstream, tokenizer: Path | None, flags: dict[str, Any]) -> Iterator[ServerThread]:
    with _server(upstream, tokenizer, flags) as server:
        yield server


def _server(upstream: Upstream, tokenizer: Path | None, flags: dict[str, Any]) -> ServerThread:
    """The guard served as `token-guard serve` serves it (uvloop aside: the thread runs its own asyncio loop)."""
    settings_flags: dict[str, Any] = {"upstream.url": url_of(upstream), **flags}
    if tokenizer is not None:
        settings_flags.update({"model.name": MODEL, "model.tokenizer": str(tokenizer)})
    settings = load_settings(settings_flags, environ={})
    return ServerThread(guard_app(upstream, settings), **uvicorn_options(settings.server))


def guard_app(upstream: Upstream, settings: Settings) -> GuardApp:
    """The guard's app; in front of an in-memory simulator, with the transport that reaches it."""
    transport = None if isinstance(upstream, str) else AsgiTransport({upstream.url: upstream.tap}, settings.upstream)
    return create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting), transport)


def keyed_guard(upstream: Upstream, tokenizer: Path, config: Path, **flags: Any) -> ServerThread:
    """A guard (not started) configured by `config`, a TOML file of keys and quotas, plus `flags`."""
    settings = load_settings(
        {"upstream.url": url_of(upstream), "model.name": MODEL, "model.tokenizer": str(tokenizer), **flags},
        environ={}, config_file=config,
    )  # fmt: skip
    return ServerThread(guard_app(upstream, settings), **uvicorn_options(settings.server))


def url_of(upstream: Upstream) -> str:
    return upstream if isinstance(upstream, str) else upstream.url


def wait_checked(server: ServerThread, upstream: Upstream) -> None:
    """The start-up check sends the upstream a few 1-token generations: once it is done, a simulator upstream forgets
    them, so that a test counts only what its own requests did."""
    if not eventually(lambda: server.app.registry.checked, timeout_s=60):
        raise AssertionError("the guard's start-up check did not finish")
    if isinstance(upstream, InMemorySim):
        upstream.client.post("/sim/reset")
        return
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{upstream.split(',')[0]}/sim/reset", timeout=5)


def wait_healthy(url: str, timeout_s: float = 10.0) -> None:
    if not eventually(lambda: httpx.get(f"{url}/health").status_code == 200, timeout_s):
        raise AssertionError(f"{url}/health never answered 200")
