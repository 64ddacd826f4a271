"""vLLM 0.33 ends a Responses stream cut at max_output_tokens with `response.incomplete` (0.31/0.32: always
`response.completed`). The guard records a stored response from either ending, so the next turn of a streamed
conversation is counted with the stored part, exactly, instead of in part."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.servers import MODEL, guard, simulator

WINDOW = 2048


@pytest.fixture(scope="module")
def guard_url(deepseek_dir: Path) -> Iterator[str]:
    with (
        simulator(deepseek_dir, profile="0.33", max_model_len=WINDOW, responses_store=True) as (sim, _, _),
        guard(sim.url, deepseek_dir) as proxy,
    ):
        yield proxy.url


def test_a_streamed_conversation_ending_incomplete_is_continued_exactly(guard_url: str) -> None:
    oai = openai.OpenAI(base_url=f"{guard_url}/v1", api_key="unused", max_retries=0, timeout=60)
    previous = None
    for turn in range(3):
        raw = oai.responses.with_raw_response.create(
            model=MODEL, input=f"Turn {turn}: what next?", previous_response_id=previous, max_output_tokens=20,
            stream=True,
        )  # fmt: skip
        events: Any = list(raw.parse())
        assert events[-1].type == "response.incomplete"  # 0.33's ending for a response cut at its limit
        assert raw.headers["x-token-guard-action"] != "partial"
        assert int(raw.headers["x-token-guard-prompt-tokens"]) == events[-1].response.usage.input_tokens
        previous = events[-1].response.id
