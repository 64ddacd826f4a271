"""Real servers on loopback for end-to-end tests: the simulator, the guard in front of it, and a tap that records
the exact bytes the simulator sent."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import load_settings
from proxy.simulator import SimulatorSettings
from proxy.simulator import create_app as create_simulator
from tests.support.polling import eventually

MODEL = "tiny"


class Tap:
    """ASGI middleware keeping the response body bytes and the raw query string of every HTTP request, in order."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.bodies: list[bytes] = []
        self.queries: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.queries.append(scope["query_string"])
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


@contextmanager
def guard(upstream: str, tokenizer: Path | None = None, **flags: Any) -> Iterator[ServerThread]:
    """The guard in front of `upstream`, once its /health says ready."""
    with _guard(upstream, tokenizer, flags) as server:
        wait_healthy(server.url)
        wait_checked(server, upstream)
        yield server


def guard_unchecked(upstream: str, tokenizer: Path | None = None, **flags: Any) -> ServerThread:
    """The guard in front of an upstream that may never be healthy (a started ServerThread's context manager)."""
    return _server(upstream, tokenizer, flags)


@contextmanager
def _guard(upstream: str, tokenizer: Path | None, flags: dict[str, Any]) -> Iterator[ServerThread]:
    with _server(upstream, tokenizer, flags) as server:
        yield server


def _server(upstream: str, tokenizer: Path | None, flags: dict[str, Any]) -> ServerThread:
    """The guard served as `token-guard serve` serves it (uvloop aside: the thread runs its own asyncio loop)."""
    settings_flags: dict[str, Any] = {"upstream.url": upstream, **flags}
    if tokenizer is not None:
        settings_flags.update({"model.name": MODEL, "model.tokenizer": str(tokenizer)})
    settings = load_settings(settings_flags, environ={})
    app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
    return ServerThread(app, **uvicorn_options(settings.server))


def wait_checked(server: ServerThread, upstream: str) -> None:
    """The start-up check sends the upstream a few 1-token generations: once it is done, a simulator upstream forgets
    them, so that a test counts only what its own requests did."""
    if not eventually(lambda: server.app.registry.checked, timeout_s=60):
        raise AssertionError("the guard's start-up check did not finish")
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{upstream.split(',')[0]}/sim/reset", timeout=5)


def wait_healthy(url: str, timeout_s: float = 10.0) -> None:
    if not eventually(lambda: httpx.get(f"{url}/health").status_code == 200, timeout_s):
        raise AssertionError(f"{url}/health never answered 200")
