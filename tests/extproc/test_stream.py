"""The bodies the external processor holds at once are bounded in total (server.max_held_body_bytes), behind a real
Envoy: while one upload holds the room, another body is answered 503 with Retry-After in the OpenAI envelope from
its headers (its declared length) or from the piece that would take the total past the bound, before the processor
reads it, and it never reaches the upstream; once the first request is done its room comes back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.envoy import cluster, processor
from proxy.settings import load_settings
from tests.support.envoy import Envoy, ProcessorThread, envoy
from tests.support.polling import eventually
from tests.support.servers import MODEL, simulator
from tests.support.uploads import begun, ended

HELD = 2 * 2**20  # server.max_body_bytes and server.max_held_body_bytes: room for one such body at a time
SIZE = 1_500_000  # each test body: two do not fit at once


@dataclass
class Rig:
    envoy: Envoy
    processor: ProcessorThread
    stats: Any


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    with simulator(deepseek_dir) as (sim, stats, _):
        flags = {"upstream.url": sim.url, "model.name": MODEL, "model.tokenizer": str(deepseek_dir),
                 "server.max_body_bytes": HELD, "server.max_held_body_bytes": HELD}  # fmt: skip
        with ProcessorThread(load_settings(flags, environ={})) as guard:
            guard.checked(sim.url)
            listeners = {"buffered": [processor("guard", "BUFFERED")],
                         "duplex": [processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")]}  # fmt: skip
            upstream = int(sim.url.rsplit(":", 1)[1])
            with envoy(
                tmp_path_factory.mktemp("envoy"), upstream, listeners, [cluster("guard", guard.port, grpc=True)]
            ) as running:
                yield Rig(running, guard, stats)


def body() -> bytes:
    """A small chat request padded to SIZE bytes with a field the guard passes on unread."""
    head = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "pad": ""}
    pad = SIZE - len(json.dumps(head))
    return json.dumps({**head, "pad": "x" * pad}).encode()


@pytest.mark.parametrize(("listener", "chunked"), [("buffered", False), ("duplex", False), ("duplex", True)],
                         ids=["buffered", "duplex", "duplex chunked"])  # fmt: skip
def test_a_body_past_those_held_at_once_is_answered_503_unread(rig: Rig, listener: str, chunked: bool) -> None:
    """An upload under way through FULL_DUPLEX_STREAMED holds what came of it in the processor (a BUFFERED one is
    held by Envoy until it is whole); a body that does not fit beside it is refused, through either listener."""
    url, raw, bodies = rig.envoy.urls[listener], body(), rig.processor.core.bodies
    held = begun(rig.envoy.urls["duplex"], raw, chunked)
    assert eventually(lambda: bodies.held >= SIZE - 1000)  # its declared length, or what came of it
    received = rig.stats.received
    refused = httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"},
                         timeout=30)  # fmt: skip
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == "server_busy" and error["type"] == "ServiceUnavailableError"
    assert "server.max_held_body_bytes" in error["message"]
    assert rig.stats.received == received  # it never reached the upstream
    assert ended(held, raw, chunked) == 200
    assert eventually(lambda: bodies.held == 0)  # given back with its request
    again = httpx.post(f"{url}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert again.status_code == 200, again.text
