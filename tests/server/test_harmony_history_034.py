"""gpt-oss Responses histories that hit what vLLM 0.34 changed in turning input items into harmony messages, sent
through the real `openai` SDK to the guard in front of the simulator's 0.33 and 0.34 profiles
(tests/support/harmony_history.py): the guard learns the release from the upstream and counts each history as the
usage that release charges, a continuation of it included; what the release refuses, the guard refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.support import zoo
from tests.support.harmony_history import HISTORIES, REFUSED, HarmonyHistory
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def client(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, openai.OpenAI, InMemorySim]]:
    gpt_oss = zoo.gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"))
    with (
        simulator_in_memory(gpt_oss, profile=request.param, max_model_len=4096, responses_store=True) as sim,
        guard(sim, gpt_oss) as proxy,
    ):
        yield request.param, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0), sim


def create(oai: openai.OpenAI, **fields: Any) -> tuple[int, int, Any]:
    """The guard's count, the usage the simulator charges, and the reply."""
    raw = oai.responses.with_raw_response.create(model=MODEL, max_output_tokens=4, **fields)
    reply: Any = raw.parse()
    assert raw.headers["x-token-guard-action"] == "pass"
    return int(raw.headers["x-token-guard-prompt-tokens"]), reply.usage.input_tokens, reply


@pytest.mark.parametrize("history", HISTORIES, ids=[h.name for h in HISTORIES])
def test_counted_as_the_release_charges_or_refused(
    history: HarmonyHistory, client: tuple[str, openai.OpenAI, InMemorySim]
) -> None:
    release, oai, sim = client
    expected = history.since if release == "0.34" else history.before
    if expected == REFUSED:
        with pytest.raises(openai.BadRequestError) as refused:
            oai.responses.create(model=MODEL, input=history.items, max_output_tokens=4)  # type: ignore[arg-type]
        assert refused.value.status_code == 400
        return
    counted, charged, first = create(oai, input=history.items)
    assert counted == charged
    counted, charged, _ = create(oai, input="And tomorrow?", previous_response_id=first.id)
    assert counted == charged  # the stored conversation holds what the release rendered for the history
