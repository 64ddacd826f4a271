"""`background: true` on /v1/responses as vLLM 0.31 and 0.32 run it: refused without the Responses store,
answered `queued` at once, run after that answer (holding its KV cache until it ends), retrieved by id, cancelled
while queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.polling import eventually
from tests.support.servers import MODEL, InMemorySim, simulator_in_memory


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, itl_s=0.02, kv_capacity_tokens=100_000, responses_store=True) as running:
        yield running


@pytest.fixture
def oai(sim: InMemorySim) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, http_client=sim.client)


def status(oai: openai.OpenAI, response_id: str) -> str | None:
    return oai.responses.retrieve(response_id).status


def test_a_background_response_is_queued_then_runs_to_its_end(oai: openai.OpenAI, sim: InMemorySim) -> None:
    queued = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=20, background=True)
    assert (queued.status, queued.output, queued.usage, queued.background) == ("queued", [], None, True)
    assert sim.stats.kv.running > 0  # its KV cache is held after the answer ended
    assert eventually(lambda: status(oai, queued.id) == "incomplete")  # ran to its limit, as every answer here
    done = oai.responses.retrieve(queued.id)
    assert done.usage is not None and done.usage.output_tokens == 20 and done.output_text
    assert sim.stats.kv.running == 0


def test_the_response_is_stored_under_the_bodys_request_id(oai: openai.OpenAI) -> None:
    named = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=5, background=True,
                                 extra_body={"request_id": "resp_mine"})  # fmt: skip
    assert named.id == "resp_mine"
    assert eventually(lambda: status(oai, "resp_mine") == "incomplete")


def test_a_queued_response_can_be_cancelled(oai: openai.OpenAI, sim: InMemorySim) -> None:
    queued = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=1000, background=True)
    assert oai.responses.cancel(queued.id).status == "cancelled"
    assert status(oai, queued.id) == "cancelled"
    assert eventually(lambda: sim.stats.kv.running == 0)
    with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
        oai.responses.cancel(queued.id)


def test_an_unknown_id_is_a_404(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="Response with id 'resp_none' not found"):
        oai.responses.retrieve("resp_none")


@pytest.mark.parametrize(
    ("options", "says"),
    [({"store": False}, "background can only be used when `store` is true"), ({}, "VLLM_ENABLE_RESPONSES_API_STORE")],
)
def test_background_needs_the_store(deepseek_dir: Path, options: dict[str, Any], says: str) -> None:
    store = bool(options)  # the second case: the server's store off
    with simulator_in_memory(deepseek_dir, responses_store=store) as sim:
        oai = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, http_client=sim.client)
        with pytest.raises(openai.BadRequestError, match=says):
            oai.responses.create(model=MODEL, input="Hi", background=True, extra_body=options)


def test_a_queued_response_is_continued_with_the_messages_rendered_for_it(oai: openai.OpenAI) -> None:
    queued = oai.responses.create(model=MODEL, input="Hi", instructions="Be brief.", max_output_tokens=1000,
                                  background=True)  # fmt: skip
    later = oai.responses.create(model=MODEL, input="More", previous_response_id=queued.id, max_output_tokens=5)
    turns: Any = [{"role": "user", "content": "Hi"}, {"role": "user", "content": "More"}]
    alone = oai.responses.create(model=MODEL, input=turns, max_output_tokens=5, store=False)
    assert later.usage is not None and alone.usage is not None
    assert later.usage.input_tokens == alone.usage.input_tokens  # as vLLM: its msg_store is set before it runs
    assert oai.responses.cancel(queued.id).status == "cancelled"
