"""The in-memory transport the handler tests reach the simulator through (tests/support/fakehttp.py) keeps what the
guard relies on of the real one: a stream's pieces arrive as the simulator yields them, closing an answer early is a
disconnect that makes the simulator abort, and failures are the guard's own errors (refused, timed out, broken)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.types import Receive, Scope, Send

from proxy.errors import UpstreamRefused, UpstreamTimeout, UpstreamUnavailable
from proxy.settings import UpstreamSettings
from proxy.upstream.client import Upstream
from simulator import SimulatorSettings, SimulatorStats
from simulator import create_app as create_simulator
from tests.support.fakehttp import AsgiTransport
from tests.support.polling import until
from tests.support.servers import MODEL

BASE = "http://simulator.invalid:8000"
JSON = {"content-type": "application/json"}


def simulator(deepseek_dir: Path, **options: Any) -> Starlette:
    return create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, **options))


def chat(max_tokens: int, stream: bool) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "stream": stream}
    return json.dumps(body).encode()


def test_a_stream_arrives_piece_by_piece_and_closing_it_early_aborts_the_generation(deepseek_dir: Path) -> None:
    app = simulator(deepseek_dir, itl_s=0.01)
    stats: SimulatorStats = app.state.stats

    async def go() -> tuple[list[bytes], int, int]:
        transport = AsgiTransport({BASE: app})
        answer = await transport.open("POST", BASE, "/v1/chat/completions", "", JSON, chat(500, stream=True))
        assert answer.status == 200 and answer.is_sse
        pieces: list[bytes] = []
        async with contextlib.aclosing(answer.pieces()) as reading:
            async for piece in reading:
                pieces.append(piece)
                if len(pieces) == 3:
                    break
        generating = stats.active  # 500 tokens at 10 ms each: still generating with three pieces in hand
        answer.close()
        assert await until(lambda: stats.active == 0)
        await transport.aclose()
        return pieces, generating, stats.aborted

    pieces, generating, aborted = asyncio.run(go())
    assert all(piece.startswith(b"data: {") and piece.endswith(b"\n\n") for piece in pieces)  # one event a piece
    assert generating == 1 and aborted == 1 and stats.completed == 0


def test_a_whole_answer_is_the_simulators_and_it_completes(deepseek_dir: Path) -> None:
    app = simulator(deepseek_dir)

    async def go() -> dict[str, Any]:
        transport = AsgiTransport({BASE: app})
        answer = await transport.open("POST", BASE, "/v1/chat/completions", "", JSON, chat(4, stream=False))
        try:
            body: dict[str, Any] = json.loads(await answer.read(2**20))
        finally:
            answer.close()
        await transport.aclose()
        return body

    body = asyncio.run(go())
    assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 4
    assert app.state.stats.completed == 1 and app.state.stats.requests[-1]["max_tokens"] == 4


def test_a_replica_without_an_app_refuses_and_upstream_takes_it_out(deepseek_dir: Path) -> None:
    settings = UpstreamSettings(urls=("http://nothing.invalid:1", BASE), retries=1)

    async def go() -> tuple[int, list[bool]]:
        upstream = Upstream(settings, AsgiTransport({BASE: simulator(deepseek_dir)}, settings))
        with pytest.raises(UpstreamRefused):
            await AsgiTransport({}).open("GET", BASE, "/health", "", {}, b"")
        opened = await upstream.open("POST", "/v1/chat/completions", JSON, chat(2, stream=False))
        opened.response.close()
        await upstream.aclose()
        return opened.response.status, [r.budget.available for r in upstream.replicas]

    status, available = asyncio.run(go())
    assert status == 200 and available == [False, True]  # retried on the replica that answers


def test_an_upstream_silent_past_its_timeouts_is_an_upstream_timeout(deepseek_dir: Path) -> None:
    settings = UpstreamSettings(urls=(BASE,), first_byte_timeout_s=0.2, read_timeout_s=0.2)

    async def go() -> None:
        transport = AsgiTransport({BASE: simulator(deepseek_dir, ttft_s=30.0)}, settings)
        try:
            with pytest.raises(UpstreamTimeout, match="no response headers"):
                await transport.open("POST", BASE, "/v1/chat/completions", "", JSON, chat(2, stream=False))
            answer = await transport.open("POST", BASE, "/v1/chat/completions", "", JSON, chat(2, stream=True))
            with pytest.raises(UpstreamTimeout, match="silent for read_timeout_s"):
                await answer.read(2**20)  # the stream's headers come at once, its first token after 30 s
        finally:
            await transport.aclose()

    asyncio.run(go())


async def breaks_mid_answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    raise RuntimeError("the engine died")


def test_an_app_that_fails_mid_answer_is_a_broken_connection() -> None:
    async def go() -> list[bytes]:
        transport = AsgiTransport({BASE: breaks_mid_answer})
        answer = await transport.open("POST", BASE, "/v1/chat/completions", "", JSON, b"{}")
        got: list[bytes] = []
        with pytest.raises(UpstreamUnavailable, match="broke the connection"):
            async for piece in answer.pieces():
                got.append(piece)
        await transport.aclose()
        return got

    assert asyncio.run(go()) == [b"data: {}\n\n"]
