"""The simulator's gpt-oss Responses (a model whose config.json says model_type gpt_oss), as vLLM 0.31/0.32 render
them with openai_harmony: a continuation renders what the store keeps for the response it continues (its preamble,
input and answer) as it is, then the new input, whatever new instructions it brings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import zoo
from tests.support.servers import MODEL, simulator_in_memory


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"))


def create(sim: Any, **body: Any) -> Any:
    return sim.client.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 8, **body})


def test_a_continuation_renders_the_stored_preamble_and_answer_not_its_new_instructions(gpt_oss_dir: Path) -> None:
    with simulator_in_memory(gpt_oss_dir, responses_store=True) as sim:
        first = create(sim, input="Hi", instructions="Be brief.", reasoning={"effort": "low"}).json()
        text = first["output"][0]["content"][0]["text"]
        second = create(sim, input="More", previous_response_id=first["id"], instructions="Write at length.").json()
        alone = create(sim, input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": text},
                                   {"role": "user", "content": "More"}], instructions="Be brief.",
                       reasoning={"effort": "low"}, store=False).json()  # fmt: skip
        assert second["usage"]["input_tokens"] == alone["usage"]["input_tokens"]
        longer = create(
            sim,
            input="More",
            previous_response_id=first["id"],
            instructions="Write at length.",
            reasoning={"effort": "high"},
            tools=[{"type": "function", "name": "f", "parameters": {}}],
        )
        assert longer.json()["usage"]["input_tokens"] == second["usage"]["input_tokens"]  # no preamble rebuilt


def test_an_output_for_a_call_it_never_saw_and_an_effort_harmony_lacks_are_vllms_400(gpt_oss_dir: Path) -> None:
    with simulator_in_memory(gpt_oss_dir, responses_store=True) as sim:
        orphan = create(sim, input=[{"type": "function_call_output", "call_id": "c9", "output": "x"}])
        assert orphan.status_code == 400 and orphan.json()["error"]["message"] == "No call message found for c9"
        minimal = create(sim, input="Hi", reasoning={"effort": "minimal"})
        assert minimal.status_code == 400 and "not supported by Harmony" in minimal.json()["error"]["message"]
