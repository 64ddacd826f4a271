"""Background responses (`background: true` on /v1/responses) through the guard to the simulator (vLLM's background
mode: `queued` at once, run after that answer): each holds its admission ticket until vLLM says it ended, so ten of
them against a KV budget that fits two run two at a time, all complete, and a limited key is charged each one's usage;
one cancelled gives its ticket back; and `admission.background = "refuse"` answers them 400."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.server.running import ServerThread
from tests.support.polling import eventually
from tests.support.prometheus import metric
from tests.support.servers import MODEL, guard, keyed_guard, simulator, wait_healthy

WINDOW = 4096
BUDGET = 4096  # admission.max_inflight_tokens: two of the requests below, not three
OUTPUT = 400
KEYS = """[server]
api_keys = ["plain"]
metrics_api_key = "sk-scrape"

[[keys]]
name = "agent"
key = "sk-agent"
tokens_per_minute = 100000000
"""
SCRAPE = {"Authorization": "Bearer sk-scrape"}


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


PROMPT = essay(700)


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[tuple[ServerThread, Any]]:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.002, responses_store=True) as (server, stats, _):
        yield server, stats


@pytest.fixture(scope="module")
def proxy(sim: tuple[ServerThread, Any], deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("keys") / "guard.toml"
    config.write_text(KEYS)
    flags = {"admission.max_inflight_tokens": BUDGET, "admission.background_poll_s": 0.05}
    with keyed_guard(sim[0].url, deepseek_dir, config, **flags) as server:
        wait_healthy(server.url)
        yield server.url


def scraped(proxy: str) -> str:
    return httpx.get(f"{proxy}/metrics", headers=SCRAPE).text


async def ten_background(proxy: str) -> list[Any]:
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="sk-agent", max_retries=0, timeout=120) as oai:
        calls = [oai.responses.with_raw_response.create(model=MODEL, input=PROMPT, max_output_tokens=OUTPUT,
                                                        background=True) for _ in range(10)]  # fmt: skip
        return list(await asyncio.gather(*calls))


def test_ten_background_responses_run_two_at_a_time_each_charged_its_usage(
    proxy: str, sim: tuple[ServerThread, Any]
) -> None:
    stats = sim[1]
    charged_before = metric(scraped(proxy), "token_guard_key_tokens_charged_total", key="agent")
    raws = asyncio.run(ten_background(proxy))
    cost = int(raws[0].headers["x-token-guard-prompt-tokens"]) + OUTPUT
    assert BUDGET // 3 < cost <= BUDGET // 2  # two fit in the budget, three do not
    queued = [raw.parse() for raw in raws]
    assert {reply.status for reply in queued} == {"queued"} and len({reply.id for reply in queued}) == 10
    oai = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-agent", max_retries=0, timeout=30)

    def finished() -> list[Any]:
        return [done for reply in queued if (done := oai.responses.retrieve(reply.id)).status == "incomplete"]

    assert eventually(lambda: len(finished()) == 10, timeout_s=120, interval_s=0.2)
    assert stats.kv.peak <= BUDGET  # never more than two ran at once
    assert eventually(lambda: metric(scraped(proxy), "token_guard_inflight_tokens") == 0)
    used = sum(done.usage.total_tokens for done in finished())
    assert used == 10 * cost  # each ran to its limit
    assert eventually(
        lambda: metric(scraped(proxy), "token_guard_key_tokens_charged_total", key="agent") - charged_before == used
    )


def test_a_cancelled_background_response_gives_its_ticket_back(proxy: str, sim: tuple[ServerThread, Any]) -> None:
    oai = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-agent", max_retries=0, timeout=30)
    queued = oai.responses.create(model=MODEL, input=PROMPT, max_output_tokens=3000, background=True)
    assert metric(scraped(proxy), "token_guard_inflight_tokens") > 0  # held after its answer ended
    assert oai.responses.cancel(queued.id).status == "cancelled"
    assert eventually(lambda: metric(scraped(proxy), "token_guard_inflight_tokens") == 0)


def test_a_deployment_can_refuse_background_responses(sim: tuple[ServerThread, Any], deepseek_dir: Path) -> None:
    flags = {"admission.max_inflight_tokens": BUDGET, "admission.background": "refuse"}
    with guard(sim[0].url, deepseek_dir, **flags) as server:
        oai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)
        with pytest.raises(openai.BadRequestError, match="admission.background") as refused:
            oai.responses.create(model=MODEL, input="Hi", max_output_tokens=5, background=True)
        assert refused.value.param == "background"
        assert oai.responses.create(model=MODEL, input="Hi", max_output_tokens=5).status == "incomplete"
