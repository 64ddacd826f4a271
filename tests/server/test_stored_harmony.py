"""A gpt-oss conversation continued by `previous_response_id` through the guard (serve), in front of a simulator of
vLLM 0.31 that stores Responses and renders them with openai_harmony as vLLM does for a `gpt_oss` model: each turn is
counted with everything vLLM keeps for the response it continues (its harmony messages and its answer), and clamped so
that 0.31, which refuses a prompt and limit over the window, serves it. The e2e suite has no gpt-oss model small
enough for the CPU: the simulator stands in for vLLM here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, guard, simulator

WINDOW = 2048
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL: Any = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": CITY}


@pytest.fixture(scope="module")
def gpt_oss_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.gpt_oss_dir(tmp_path_factory.mktemp("gpt-oss"))


@pytest.fixture(scope="module")
def replica_url(gpt_oss_dir: Path) -> Iterator[str]:
    with simulator(gpt_oss_dir, profile="0.31", max_model_len=WINDOW, responses_store=True) as (replica, _, _):
        yield replica.url


@pytest.fixture(scope="module")
def guard_url(replica_url: str, gpt_oss_dir: Path) -> Iterator[str]:
    with guard(replica_url, gpt_oss_dir) as server:
        yield server.url


def create(url: str, **fields: Any) -> tuple[int, int, Any]:
    """A create asking for far more output than the window, stopping early: the guard's count, vLLM's, the reply."""
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)
    raw = oai.responses.with_raw_response.create(model=MODEL, max_output_tokens=100000, extra_body={"stop": ["the"]},
                                                 **fields)  # fmt: skip
    assert raw.http_response.status_code == 200
    assert raw.headers["x-token-guard-action"] == "clamp"
    reply: Any = raw.parse()
    return int(raw.headers["x-token-guard-prompt-tokens"]), reply.usage.input_tokens, reply


def test_three_turns_are_counted_exactly_and_each_served_by_vllm_0_31(guard_url: str) -> None:
    """The first turn is long: a continuation counted without it (as `partial`) is clamped to a limit that leaves no
    room for it, and vLLM 0.31 refuses it."""
    long = "Tell me about the weather, city by city: " + ", ".join(f"town number {i}" for i in range(250))
    guard, vllm, first = create(guard_url, input=long, instructions="Be brief.", tools=[TOOL],
                                reasoning={"effort": "low"})  # fmt: skip
    assert guard == vllm > 1000
    guard, vllm, second = create(guard_url, input="And tomorrow?", previous_response_id=first.id,
                                 instructions="Not rendered: the stored preamble is.")  # fmt: skip
    assert guard == vllm > 1000
    result = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    guard, vllm, _ = create(guard_url, input=[{"role": "user", "content": "Oslo?"}, call, result],
                            previous_response_id=second.id)  # fmt: skip
    assert guard == vllm


def test_a_continuation_counted_exactly_keeps_its_room_for_the_next_turn(guard_url: str) -> None:
    _, _, first = create(guard_url, input="Hi " * 600)
    oai = openai.OpenAI(base_url=f"{guard_url}/v1", api_key="none", max_retries=0, timeout=60)
    raw = oai.responses.with_raw_response.create(model=MODEL, input="More.", previous_response_id=first.id,
                                                 max_output_tokens=100000, extra_body={"stop": ["the"]})  # fmt: skip
    prompt, limit = int(raw.headers["x-token-guard-prompt-tokens"]), int(raw.headers["x-token-guard-max-tokens"])
    assert raw.headers["x-token-guard-action"] == "clamp" and prompt + limit <= WINDOW
    assert int(raw.headers["x-token-guard-next-turn-tokens"]) == WINDOW - prompt - limit > 0


def test_the_guard_counts_a_continuation_itself_where_the_upstream_counts(replica_url: str, gpt_oss_dir: Path) -> None:
    """`counting.source = "upstream"`: vLLM's counting endpoints render chat, never a stored harmony conversation."""
    with guard(replica_url, gpt_oss_dir, **{"counting.source": "upstream"}) as server:
        guard_count, vllm, first = create(server.url, input="Weather?", instructions="Be brief.", tools=[TOOL])
        assert guard_count == vllm
        guard_count, vllm, _ = create(server.url, input="Tomorrow?", previous_response_id=first.id)
        assert guard_count == vllm
