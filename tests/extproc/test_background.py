"""Background responses behind a real Envoy (1.40) with token-guard as its external processor: vLLM (the simulator's
background mode) answers `queued` and runs each after the exchange has ended, so the processor holds each one's
admission ticket past its stream's end, until vLLM says it ended; ten against a KV budget that fits two run two at a
time and all complete, whether Envoy sends the processor the answer's body or not."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from bench.envoy import cluster, processor
from tests.support.envoy import Envoy, envoy
from tests.support.extproc import extproc
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.prometheus import metric
from tests.support.servers import MODEL, simulator

WINDOW = 4096
BUDGET = 4096  # two of the requests below, not three
OUTPUT = 400
PROMPT = " ".join(f"word{i % 50}" for i in range(700))


@dataclass
class Rig:
    envoy: Envoy
    stats: Any


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    port = free_port()
    settings = {"TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS": str(BUDGET),
                "TOKEN_GUARD_ADMISSION_BACKGROUND_POLL_S": "0.05"}  # fmt: skip
    options = {"max_model_len": WINDOW, "itl_s": 0.002, "responses_store": True}
    with simulator(deepseek_dir, **options) as (sim, stats, _):
        listeners = {
            "streamed": [processor("guard", "BUFFERED")],  # the answer's body comes to the processor
            "unseen": [processor("guard", "BUFFERED", "NONE")],  # it does not
        }
        clusters = [cluster("guard", port, grpc=True)]
        log = tmp_path_factory.mktemp("extproc") / "extproc.log"
        with (
            extproc(sim.url, deepseek_dir, log, port, **settings),
            envoy(tmp_path_factory.mktemp("envoy"), int(sim.url.rsplit(":", 1)[1]), listeners, clusters) as running,
        ):
            yield Rig(running, stats)


async def ten_background(url: str) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120) as oai:
        calls = [oai.responses.create(model=MODEL, input=PROMPT, max_output_tokens=OUTPUT, background=True)
                 for _ in range(10)]  # fmt: skip
        return list(await asyncio.gather(*calls))


@pytest.mark.parametrize("listener", ["streamed", "unseen"])
def test_ten_background_responses_run_two_at_a_time(rig: Rig, listener: str) -> None:
    url = rig.envoy.urls[listener]
    rig.stats.kv.reset()
    queued = asyncio.run(ten_background(url))
    assert {reply.status for reply in queued} == {"queued"}
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=30)

    def done() -> int:
        return sum(oai.responses.retrieve(reply.id).status == "incomplete" for reply in queued)

    assert eventually(lambda: done() == 10, timeout_s=120, interval_s=0.2)
    assert 0 < rig.stats.kv.peak <= BUDGET  # never more than two ran at once

    def scraped() -> str:
        return httpx.get(f"{url}/metrics", timeout=10).text

    assert eventually(lambda: metric(scraped(), "token_guard_inflight_tokens") == 0)
