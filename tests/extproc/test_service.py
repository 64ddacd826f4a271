"""`token-guard extproc` stops when told, behind a real Envoy (1.40), however it was used before.

At e63017a a processor that had parsed a large body in its child process never exited on a SIGTERM to its process
group: the idle child died holding its pool's queue lock, which the exit then waited for."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.envoy import cluster, processor
from proxy.counting.isolated import LARGE_BODY_BYTES
from tests.support.envoy import Envoy, envoy
from tests.support.extproc import extproc
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import MODEL, simulator

MARGIN_S = 20  # beyond the drain's own time: only a processor that hangs needs more


@dataclass
class Rig:
    envoy: Envoy
    upstream: str
    stats: Any
    tokenizer: Path
    first: int  # the port of the processor every listener asks

    def processor(self, log: Path, **env: str) -> Any:
        """The processor every listener asks (the first); `env`: its TOKEN_GUARD_* settings."""
        return extproc(self.upstream, self.tokenizer, log, self.first, **env)

    def ready_through(self, listener: str) -> bool:
        try:
            return httpx.get(f"{self.envoy.urls[listener]}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    first = free_port()
    with simulator(deepseek_dir, itl_s=0.05) as (sim, stats, _):  # 20 tokens a second
        listeners = {
            "buffered": [processor("guard", "BUFFERED")],
            "duplex": [processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")],
        }
        clusters = [cluster("guard", first, grpc=True)]
        with envoy(tmp_path_factory.mktemp("envoy"), int(sim.url.rsplit(":", 1)[1]), listeners, clusters) as running:
            yield Rig(running, sim.url, stats, deepseek_dir, first)


def chat(max_tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, "stream": stream}


def answered(rig: Rig, listener: str) -> int:
    return httpx.post(
        f"{rig.envoy.urls[listener]}/v1/chat/completions", json=chat(3, stream=False), timeout=60
    ).status_code


def test_a_processor_envoy_holds_only_idle_connections_to_exits_at_once(rig: Rig, tmp_path: Path) -> None:
    with rig.processor(tmp_path / "extproc.log", TOKEN_GUARD_SERVER_DRAIN_TIMEOUT_S="5") as guard:
        assert eventually(lambda: rig.ready_through("buffered"), timeout_s=30)
        assert [answered(rig, listener) for listener in ("buffered", "duplex") for _ in range(3)] == [200] * 6
        words = "word " * (LARGE_BODY_BYTES // 5 + 1000)  # parsed in the processor's child process
        large = {"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": 5}
        refused = httpx.post(f"{rig.envoy.urls['duplex']}/v1/chat/completions", json=large, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        guard.terminate()
        assert guard.process.wait(timeout=5 + MARGIN_S) == 0
